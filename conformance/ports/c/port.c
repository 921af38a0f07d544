/*
 * One file of ~850 lines on purpose: a porter copies one file and one build line; the
 * safetensors reader and writer (with float16/bfloat16 bits by hand) are a third of it.
 *
 * The attention contract (docs/SEMANTICS.md, v1 and v2) in C99 with Debian's libcjson for JSON:
 * scaled_dot_product_attention, attention_weights and causal_mask for float64, float32, float16
 * and bfloat16, with the same numbered steps and names as impl_numpy/functional.py and
 * conformance/ports/js/port.js (its sibling). Built and checked by
 *
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -o port conformance/ports/c/port.c -lcjson -lm
 *     python -m conformance --exec "./port"
 *
 * (the xfails file is found next to the binary, so put the binary beside port.xfails, or pass
 * --xfails conformance/ports/c/port.xfails; conformance/tests/test_c_port.py does the former),
 * over the line protocol of conformance/PORTING.md ("Any language: --exec"): one JSON request
 * per run on stdin, one JSON answer on stdout; arrays in safetensors files (conformance/
 * FORMAT.md, "Dtypes" and "safetensors"), read and written here by hand, float16 and bfloat16
 * bits included. What it does not do is in port.xfails, next to it.
 *
 * Precision, as port.js: everything is computed in double (at least the contract's compute
 * dtype, float32 for float32, float16 and bfloat16 inputs) and rounded once to the input dtype
 * at the end, to nearest-even; bias, sinks and slopes are first rounded to the compute dtype,
 * as the contract says (a float64 bias of -1e300 is -inf in float32).
 *
 * Shape letters (SEMANTICS.md): query (..., H, L, D), key (..., K, S, D), value (..., K, S, E);
 * G = H / K query heads share one key/value head; scores and weights (..., H, L, S).
 */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIMS 16    /* batch dims + 3, far more than any fixture has */
#define MAX_TENSORS 16 /* arrays in one request's file */

/* ------------------------------------------------------------------------------------------ */
/* Errors: the taxonomy's class of each code this port raises (attention_spec.ERROR_CODES).    */
/* ------------------------------------------------------------------------------------------ */

static const struct {
    const char *cls;
    const char *codes[10];
} CLASSES[] = {
    {"DimensionMismatchError",
     {"rank", "qk_head_dim_mismatch", "kv_heads_mismatch", "kv_length_mismatch",
      "heads_not_divisible", "batch_not_broadcastable", "sinks_shape", "alibi_shape", NULL}},
    {"DTypeError",
     {"unsupported_dtype", "dtype_mismatch", "sinks_dtype", "alibi_dtype", "not_an_array", NULL}},
    {"MaskError",
     {"mask_dtype", "bias_dtype", "mask_kv_heads", "bias_kv_heads", "mask_shape", "bias_shape",
      "segment_ids_dtype", "segment_ids_shape", NULL}},
    {"ConfigError",
     {"non_positive_size", "segment_ids_pair", "scale_range", "softcap_range", "not_a_bool",
      "unknown_alignment", "scale_not_finite", "softcap_not_positive", "window_value", NULL}},
};

static const char *class_of(const char *code) {
    for (size_t c = 0; c < sizeof CLASSES / sizeof CLASSES[0]; c++)
        for (int i = 0; CLASSES[c].codes[i] != NULL; i++)
            if (strcmp(CLASSES[c].codes[i], code) == 0) return CLASSES[c].cls;
    return "AttentionError";
}

/* The error a call raises: its code (the class follows from it) and a message that teaches. */
typedef struct {
    const char *code;
    char message[512];
} AttentionError;

/* Record the error; returns 1, so a check reads `if (bad) return fail(err, code, ...);`. */
static int fail(AttentionError *err, const char *code, const char *format, ...) {
    va_list args;
    va_start(args, format);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, format, args);
    va_end(args);
    return 1;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "port.c: %s: %s\n", what, detail);
    exit(2); /* the runner reports the run as a crash */
}

/* ------------------------------------------------------------------------------------------ */
/* Tensors, and safetensors: 8-byte little-endian header length, a JSON header, the data.      */
/* ------------------------------------------------------------------------------------------ */

/* One array: its dtype (the manifest's name), shape, and every element widened to double
 * (bool: 0 or 1; int32 and int64 exactly, up to 2^53). */
typedef struct {
    char name[64];
    const char *dtype;
    int ndim;
    long shape[MAX_DIMS];
    size_t size;
    double *data;
} Tensor;

typedef struct {
    int n;
    Tensor t[MAX_TENSORS];
} Tensors;

static const struct {
    const char *tag, *dtype;
    int bytes;
} DTYPES[] = {
    {"F64", "float64", 8}, {"F32", "float32", 4}, {"F16", "float16", 2}, {"BF16", "bfloat16", 2},
    {"BOOL", "bool", 1},   {"I32", "int32", 4},   {"I64", "int64", 8},
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

static int dtype_index(const char *name, int by_tag) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(by_tag ? DTYPES[i].tag : DTYPES[i].dtype, name) == 0) return (int)i;
    return -1;
}

static const Tensor *find(const Tensors *arrays, const char *name) { /* NULL: not given */
    for (int i = 0; i < arrays->n; i++)
        if (strcmp(arrays->t[i].name, name) == 0) return &arrays->t[i];
    return NULL;
}

static void free_tensors(Tensors *arrays) {
    for (int i = 0; i < arrays->n; i++) free(arrays->t[i].data);
    arrays->n = 0;
}

static size_t prod(const long *shape, int ndim) {
    size_t n = 1;
    for (int a = 0; a < ndim; a++) n *= (size_t)shape[a];
    return n;
}

static uint64_t read_le(const unsigned char *p, int bytes) { /* little-endian, unsigned */
    uint64_t x = 0;
    for (int b = bytes - 1; b >= 0; b--) x = (x << 8) | p[b];
    return x;
}

static void write_le(unsigned char *p, uint64_t x, int bytes) {
    for (int b = 0; b < bytes; b++, x >>= 8) p[b] = (unsigned char)(x & 0xff);
}

static double half_to_double(unsigned h) { /* IEEE binary16 bits -> double */
    double sign = (h & 0x8000) ? -1.0 : 1.0;
    unsigned exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
    if (exp == 0) return sign * ldexp((double)frac, -24);
    if (exp == 31) return frac ? NAN : sign * INFINITY;
    return sign * ldexp(1.0 + frac / 1024.0, (int)exp - 15);
}

static double decode(const char *dtype, const unsigned char *p) { /* one element */
    uint64_t bits;
    if (strcmp(dtype, "float64") == 0) {
        double x;
        bits = read_le(p, 8);
        memcpy(&x, &bits, 8);
        return x;
    }
    if (strcmp(dtype, "float32") == 0 || strcmp(dtype, "bfloat16") == 0) {
        /* bfloat16 is the upper half of a float32: widen by shifting left 16 bits */
        uint32_t b32 = dtype[0] == 'f' ? (uint32_t)read_le(p, 4) : (uint32_t)read_le(p, 2) << 16;
        float x;
        memcpy(&x, &b32, 4);
        return x;
    }
    if (strcmp(dtype, "float16") == 0) return half_to_double((unsigned)read_le(p, 2));
    if (strcmp(dtype, "bool") == 0) return p[0] != 0;
    if (strcmp(dtype, "int32") == 0) return (double)(int32_t)(uint32_t)read_le(p, 4);
    return (double)(int64_t)read_le(p, 8); /* int64 */
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *bytes;
    long size;
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0) die("cannot read", path);
    rewind(f);
    bytes = malloc((size_t)size + 1);
    if (bytes == NULL || fread(bytes, 1, (size_t)size, f) != (size_t)size) die("cannot read", path);
    fclose(f);
    *n = (size_t)size;
    return bytes;
}

/* The tensors of a safetensors file, by name. Returns NULL, or the tag it does not know. */
static const char *read_tensors(const char *path, Tensors *out) {
    static char unknown[64];
    size_t size, n;
    unsigned char *file = read_file(path, &size);
    cJSON *header, *info;
    out->n = 0;
    if (size < 8 || (n = (size_t)read_le(file, 8)) > size - 8) die("not safetensors", path);
    header = cJSON_ParseWithLength((const char *)file + 8, n);
    if (header == NULL) die("a header that is not JSON", path);
    cJSON_ArrayForEach(info, header) {
        const cJSON *tag = cJSON_GetObjectItemCaseSensitive(info, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(info, "shape");
        const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(info, "data_offsets");
        Tensor *t = &out->t[out->n];
        const cJSON *dim;
        int d;
        size_t begin;
        if (strcmp(info->string, "__metadata__") == 0) continue;
        if (out->n == MAX_TENSORS || !cJSON_IsString(tag)) die("a header I cannot read", path);
        if ((d = dtype_index(tag->valuestring, 1)) < 0) {
            snprintf(unknown, sizeof unknown, "%s inputs", tag->valuestring);
            cJSON_Delete(header);
            free(file);
            free_tensors(out);
            return unknown;
        }
        snprintf(t->name, sizeof t->name, "%s", info->string);
        t->dtype = DTYPES[d].dtype;
        t->ndim = 0;
        cJSON_ArrayForEach(dim, shape) {
            if (t->ndim == MAX_DIMS) die("too many dims", path);
            t->shape[t->ndim++] = (long)dim->valuedouble;
        }
        t->size = prod(t->shape, t->ndim);
        begin = (size_t)cJSON_GetArrayItem(offsets, 0)->valuedouble;
        if (8 + n + begin + t->size * (size_t)DTYPES[d].bytes > size) die("data past the end", path);
        t->data = malloc(t->size ? t->size * sizeof(double) : 1);
        for (size_t i = 0; i < t->size; i++)
            t->data[i] = decode(t->dtype, file + 8 + n + begin + i * (size_t)DTYPES[d].bytes);
        out->n++;
    }
    cJSON_Delete(header);
    free(file);
    return NULL;
}

/* x rounded to nearest-even with p significant bits, exponents down to emin (below: subnormal),
 * beyond max_finite: infinite. float32: (24, -126, FLT_MAX); float16: (11, -14, 65504);
 * bfloat16: (8, -126, 0x1.fep127). */
static double round_to(double x, int p, int emin, double max_finite) {
    int e;
    double r;
    if (!isfinite(x) || x == 0) return x;
    frexp(fabs(x), &e); /* |x| = m * 2^e, m in [0.5, 1): its leading bit is 2^(e - 1) */
    e = (e - 1 > emin ? e - 1 : emin) - p + 1;   /* the exponent of one unit in the last place */
    r = ldexp(rint(ldexp(fabs(x), -e)), e);      /* rint: to nearest, ties to even (default) */
    return copysign(r > max_finite ? INFINITY : r, x);
}

static double to_float32(double x) { return (float)round_to(x, 24, -126, FLT_MAX); } /* exact */

static unsigned half_bits(double x) { /* a double -> IEEE binary16 bits, nearest-even */
    double r = round_to(x, 11, -14, 65504.0), a = fabs(r);
    unsigned sign = signbit(r) ? 0x8000u : 0u;
    int e;
    if (isnan(r)) return 0x7e00u;
    if (isinf(r)) return sign | 0x7c00u;
    if (a < ldexp(1.0, -14)) return sign | (unsigned)ldexp(a, 24); /* subnormal (or zero) */
    frexp(a, &e);
    e -= 1; /* a = 1.f * 2^e */
    return sign | (unsigned)(e + 15) << 10 | (unsigned)((ldexp(a, -e) - 1.0) * 1024.0);
}

static unsigned bfloat16_bits(double x) { /* a double -> bfloat16 bits (a float32's upper half) */
    float f = (float)round_to(x, 8, -126, 3.3895313892515355e38);
    uint32_t bits;
    if (isnan(x)) return 0x7fc0u;
    memcpy(&bits, &f, 4);
    return bits >> 16;
}

/* Write one tensor `name` of `dtype` (float64, float32, float16, bfloat16 or bool) to path. */
static void write_tensor(const char *path, const char *name, const char *dtype, const long *shape,
                         int ndim, const double *data) {
    int d = dtype_index(dtype, 0), bytes = DTYPES[d].bytes;
    size_t size = prod(shape, ndim), length;
    char header[1024];
    unsigned char *raw = malloc(size ? size * (size_t)bytes : 1), prefix[8];
    FILE *f;
    int at = snprintf(header, sizeof header, "{\"%s\":{\"dtype\":\"%s\",\"shape\":[", name,
                      DTYPES[d].tag);
    for (int a = 0; a < ndim; a++) at += snprintf(header + at, 32, a ? ",%ld" : "%ld", shape[a]);
    at += snprintf(header + at, 64, "],\"data_offsets\":[0,%lu]}}",
                   (unsigned long)(size * (size_t)bytes));
    while (at % 8) header[at++] = ' '; /* the header padded to 8 bytes */
    length = (size_t)at;
    for (size_t i = 0; i < size; i++) {
        unsigned char *p = raw + i * (size_t)bytes;
        if (strcmp(dtype, "float64") == 0) {
            uint64_t b64;
            memcpy(&b64, &data[i], 8);
            write_le(p, b64, 8);
        } else if (strcmp(dtype, "float32") == 0) {
            float x = (float)to_float32(data[i]);
            uint32_t b32;
            memcpy(&b32, &x, 4);
            write_le(p, b32, 4);
        } else if (strcmp(dtype, "float16") == 0) {
            write_le(p, half_bits(data[i]), 2);
        } else if (strcmp(dtype, "bfloat16") == 0) {
            write_le(p, bfloat16_bits(data[i]), 2);
        } else {
            p[0] = data[i] != 0; /* bool */
        }
    }
    write_le(prefix, length, 8);
    if ((f = fopen(path, "wb")) == NULL) die("cannot write", path);
    fwrite(prefix, 1, 8, f);
    fwrite(header, 1, length, f);
    fwrite(raw, 1, size * (size_t)bytes, f);
    fclose(f);
    free(raw);
}

/* ------------------------------------------------------------------------------------------ */
/* Shapes and broadcasting                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* NumPy's right-aligned broadcast of n shapes into out; 0 when they do not broadcast. */
static int broadcast_shapes(const Tensor *const *xs, int n, int drop, long *out, int *ndim) {
    *ndim = 0;
    for (int i = 0; i < n; i++)
        if (xs[i]->ndim - drop > *ndim) *ndim = xs[i]->ndim - drop;
    for (int axis = -*ndim; axis < 0; axis++) {
        long size = 1;
        for (int i = 0; i < n; i++) {
            int a = xs[i]->ndim - drop + axis;
            long s = a >= 0 ? xs[i]->shape[a] : 1;
            if (s != 1 && size != 1 && s != size) return 0;
            if (s != 1) size = s;
        }
        out[*ndim + axis] = size;
    }
    return 1;
}

/* Whether shape broadcasts to target (right-aligned; each axis 1 or the target's size). */
static int fits(const long *shape, int ndim, const long *target, int ntarget) {
    if (ndim > ntarget) return 0;
    for (int a = 0; a < ndim; a++)
        if (shape[a] != 1 && shape[a] != target[ntarget - ndim + a]) return 0;
    return 1;
}

/* Strides of shape read at a multi-index of target (right-aligned, 0 where broadcast). */
static void strides(const long *shape, int ndim, int ntarget, long *out) {
    long stride = 1;
    for (int t = 0; t < ntarget; t++) out[t] = 0;
    for (int a = ndim - 1; a >= 0; a--) {
        out[ntarget - ndim + a] = shape[a] == 1 ? 0 : stride;
        stride *= shape[a];
    }
}

static size_t dot(const long *index, const long *st, int n) {
    long sum = 0;
    for (int a = 0; a < n; a++) sum += index[a] * st[a];
    return (size_t)sum;
}

static void multi_index(size_t flat, const long *shape, int ndim, long *index) {
    for (int a = ndim - 1; a >= 0; a--) {
        index[a] = (long)(flat % (size_t)shape[a]);
        flat /= (size_t)shape[a];
    }
}

static void shape_text(const long *shape, int ndim, char *out, size_t size) { /* "[2, 3]" */
    size_t at = (size_t)snprintf(out, size, "[");
    for (int a = 0; a < ndim && at < size; a++)
        at += (size_t)snprintf(out + at, size - at, a ? ", %ld" : "%ld", shape[a]);
    if (at < size) snprintf(out + at, size - at, "]");
}

/* ------------------------------------------------------------------------------------------ */
/* Validation, in the contract's order (SEMANTICS.md, "Errors"): keywords on their own; query, */
/* key and value; each array keyword against the sizes; scale and softcap in the compute dtype. */
/* ------------------------------------------------------------------------------------------ */

/* The validated call: the keywords, then the sizes the arrays give. */
typedef struct {
    int is_causal;
    const char *alignment;
    int has_scale, has_softcap, has_window, has_left, has_right;
    double scale, softcap;
    long left, right; /* the window's sides, when given */
    int nbatch;
    long batch[MAX_DIMS];
    long H, K, G, L, S, D, E;
    const char *dtype;
    long offset; /* query i's diagonal is key i + offset */
} AttentionCall;

static int is_float(const char *dtype) {
    return strcmp(dtype, "float64") == 0 || strcmp(dtype, "float32") == 0 ||
           strcmp(dtype, "float16") == 0 || strcmp(dtype, "bfloat16") == 0;
}

static int is_int(const cJSON *x) { /* a JSON number without a fraction */
    return cJSON_IsNumber(x) && isfinite(x->valuedouble) && floor(x->valuedouble) == x->valuedouble;
}

/* A keyword number: JSON's number, or {"float": "inf" | "-inf" | "nan"}; 0 if neither. */
static int real(const cJSON *x, double *out) {
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(x, "float");
    if (cJSON_IsNumber(x)) {
        *out = x->valuedouble;
        return 1;
    }
    if (!cJSON_IsObject(x) || cJSON_GetArraySize(x) != 1 || !cJSON_IsString(tag)) return 0;
    if (strcmp(tag->valuestring, "inf") == 0) *out = INFINITY;
    else if (strcmp(tag->valuestring, "-inf") == 0) *out = -INFINITY;
    else if (strcmp(tag->valuestring, "nan") == 0) *out = NAN;
    else return 0;
    return 1;
}

static const char *json_text(const cJSON *x, char *buffer, int size) { /* for messages */
    if (x == NULL || !cJSON_PrintPreallocated((cJSON *)x, buffer, size, 0)) return "?";
    return buffer;
}

static int check_keywords(const cJSON *kw, AttentionCall *call, AttentionError *err) {
    const cJSON *is_causal = cJSON_GetObjectItemCaseSensitive(kw, "is_causal");
    const cJSON *alignment = cJSON_GetObjectItemCaseSensitive(kw, "causal_alignment");
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(kw, "scale");
    const cJSON *softcap = cJSON_GetObjectItemCaseSensitive(kw, "softcap");
    const cJSON *window = cJSON_GetObjectItemCaseSensitive(kw, "window");
    char text[128];
    memset(call, 0, sizeof *call);
    /* is_causal: absent is False; null is None, not a bool; a string "False" is a string */
    if (is_causal != NULL && !cJSON_IsBool(is_causal))
        return fail(err, "not_a_bool", "is_causal must be a bool; got %s",
                    json_text(is_causal, text, sizeof text));
    call->is_causal = cJSON_IsTrue(is_causal);
    call->alignment = "top_left";
    if (alignment != NULL) {
        if (!cJSON_IsString(alignment) || (strcmp(alignment->valuestring, "top_left") != 0 &&
                                           strcmp(alignment->valuestring, "bottom_right") != 0))
            return fail(err, "unknown_alignment",
                        "causal_alignment must be top_left or bottom_right; got %s",
                        json_text(alignment, text, sizeof text));
        call->alignment = alignment->valuestring;
    }
    if (scale != NULL && !cJSON_IsNull(scale)) {
        if (!real(scale, &call->scale) || !isfinite(call->scale))
            return fail(err, "scale_not_finite", "scale must be a finite real number; got %s",
                        json_text(scale, text, sizeof text));
        call->has_scale = 1;
    }
    if (softcap != NULL && !cJSON_IsNull(softcap)) {
        if (!real(softcap, &call->softcap) || !(call->softcap > 0) || !isfinite(call->softcap))
            return fail(err, "softcap_not_positive", "softcap must be a finite number > 0; got %s",
                        json_text(softcap, text, sizeof text));
        call->has_softcap = 1;
    }
    if (window != NULL && !cJSON_IsNull(window)) {
        const cJSON *left = cJSON_GetArrayItem(window, 0), *right = cJSON_GetArrayItem(window, 1);
        int ok = cJSON_IsArray(window) && cJSON_GetArraySize(window) == 2;
        for (int side = 0; ok && side < 2; side++) {
            const cJSON *x = side ? right : left;
            ok = cJSON_IsNull(x) || (is_int(x) && x->valuedouble >= 0);
        }
        if (!ok)
            return fail(err, "window_value",
                        "window must be a pair (left, right) of integers >= 0 or null; got %s",
                        json_text(window, text, sizeof text));
        /* a side wider than 2^53 keys is unbounded in practice: clamp it so it fits a long */
        call->has_left = !cJSON_IsNull(left);
        call->has_right = !cJSON_IsNull(right);
        if (call->has_left) call->left = (long)fmin(left->valuedouble, 9007199254740992.0);
        if (call->has_right) call->right = (long)fmin(right->valuedouble, 9007199254740992.0);
        call->has_window = call->has_left || call->has_right;
    }
    return 0;
}

static int check_arrays(AttentionCall *call, const Tensors *a, int with_value, AttentionError *err) {
    const Tensor *q = find(a, "query"), *k = find(a, "key"), *v = with_value ? find(a, "value") : NULL;
    const Tensor *qkv[3] = {q, k, v};
    const char *names[3] = {"query", "key", "value"};
    const char *sizes[5] = {"H", "K", "value K", "D", "E"};
    long H, L, D, K, S, Dk, Kv, Sv, E, scores[MAX_DIMS];
    int nscores;
    char text[128], want[128];
    for (int i = 0; i < 2 + with_value; i++)
        if (qkv[i] == NULL) return fail(err, "not_an_array", "%s must be an array; got None", names[i]);
    for (int i = 0; i < 2 + with_value; i++)
        if (qkv[i]->ndim < 3) {
            shape_text(qkv[i]->shape, qkv[i]->ndim, text, sizeof text);
            return fail(err, "rank", "%s must have at least 3 dims; got %s", names[i], text);
        }
    if (!is_float(q->dtype))
        return fail(err, "unsupported_dtype", "query dtype must be floating; got %s", q->dtype);
    if (strcmp(k->dtype, q->dtype) != 0 || (v && strcmp(v->dtype, q->dtype) != 0))
        return fail(err, "dtype_mismatch", "query, key and value must share one dtype");
    H = q->shape[q->ndim - 3], L = q->shape[q->ndim - 2], D = q->shape[q->ndim - 1];
    K = k->shape[k->ndim - 3], S = k->shape[k->ndim - 2], Dk = k->shape[k->ndim - 1];
    Kv = v ? v->shape[v->ndim - 3] : K, Sv = v ? v->shape[v->ndim - 2] : S;
    E = v ? v->shape[v->ndim - 1] : 1;
    {
        const long n[5] = {H, K, Kv, D, E};
        for (int i = 0; i < 5; i++)
            if (n[i] < 1) return fail(err, "non_positive_size", "%s must be >= 1; got %ld", sizes[i], n[i]);
    }
    if (Dk != D) return fail(err, "qk_head_dim_mismatch", "query head dim %ld != key head dim %ld", D, Dk);
    if (v && Kv != K) return fail(err, "kv_heads_mismatch", "key heads %ld != value heads %ld", K, Kv);
    if (v && Sv != S) return fail(err, "kv_length_mismatch", "key length %ld != value length %ld", S, Sv);
    if (H % K)
        return fail(err, "heads_not_divisible", "key heads (K=%ld) must divide query heads (H=%ld)", K, H);
    if (!broadcast_shapes(qkv, 2 + with_value, 3, call->batch, &call->nbatch))
        return fail(err, "batch_not_broadcastable", "leading batch dims must broadcast");
    call->H = H, call->K = K, call->G = H / K, call->L = L, call->S = S, call->D = D, call->E = E;
    call->dtype = q->dtype;

    nscores = call->nbatch + 3; /* (..., H, L, S) */
    memcpy(scores, call->batch, sizeof(long) * (size_t)call->nbatch);
    scores[nscores - 3] = H, scores[nscores - 2] = L, scores[nscores - 1] = S;
    shape_text(scores, nscores, want, sizeof want);
    for (int m = 0; m < 2; m++) {
        const char *kind = m ? "bias" : "mask";
        const Tensor *x = find(a, kind);
        if (x == NULL) continue;
        if (!m && strcmp(x->dtype, "bool") != 0)
            return fail(err, "mask_dtype", "mask must be boolean; got %s (pass a float mask as bias=)",
                        x->dtype);
        if (m && !is_float(x->dtype))
            return fail(err, "bias_dtype", "bias must be floating; got %s", x->dtype);
        shape_text(x->shape, x->ndim, text, sizeof text);
        if (x->ndim >= 3 && x->shape[x->ndim - 3] == K && K != 1 && K != H)
            return fail(err, m ? "bias_kv_heads" : "mask_kv_heads",
                        "%s head axis has size K=%ld; it must be 1 or H=%ld", kind, K, H);
        if (!fits(x->shape, x->ndim, scores, nscores))
            return fail(err, m ? "bias_shape" : "mask_shape", "%s must broadcast to %s; got %s",
                        kind, want, text);
    }
    {
        const Tensor *ids[2] = {find(a, "q_segment_ids"), find(a, "kv_segment_ids")};
        if ((ids[0] == NULL) != (ids[1] == NULL))
            return fail(err, "segment_ids_pair", "give both q_segment_ids and kv_segment_ids, or neither");
        for (int side = 0; side < 2; side++) {
            long target[MAX_DIMS];
            if (ids[side] == NULL) continue;
            if (strncmp(ids[side]->dtype, "int", 3) != 0)
                return fail(err, "segment_ids_dtype", "%s_segment_ids must be integers; got %s",
                            side ? "kv" : "q", ids[side]->dtype);
            memcpy(target, call->batch, sizeof(long) * (size_t)call->nbatch);
            target[call->nbatch] = side ? S : L; /* (..., L) and (..., S) */
            if (!fits(ids[side]->shape, ids[side]->ndim, target, call->nbatch + 1)) {
                shape_text(target, call->nbatch + 1, want, sizeof want);
                return fail(err, "segment_ids_shape", "%s_segment_ids must broadcast to %s",
                            side ? "kv" : "q", want);
            }
        }
    }
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "alibi_slopes" : "sinks", *shape_code = i ? "alibi_shape" : "sinks_shape";
        const Tensor *x = find(a, name);
        if (x == NULL) continue;
        shape_text(x->shape, x->ndim, text, sizeof text);
        if (x->ndim != 1 || x->shape[0] != H)
            return fail(err, shape_code, "%s must have shape (H=%ld,); got %s", name, H, text);
        if (!is_float(x->dtype))
            return fail(err, i ? "alibi_dtype" : "sinks_dtype", "%s must be floating; got %s", name,
                        x->dtype);
    }
    {
        int ct64 = strcmp(q->dtype, "float64") == 0;
        double finite_max = ct64 ? DBL_MAX : FLT_MAX;
        double low = ldexp(1.0, ct64 ? -969 : -102), high = ldexp(1.0, ct64 ? 969 : 102);
        if (call->has_scale && !(fabs(call->scale) <= finite_max))
            return fail(err, "scale_range", "scale must be finite in the compute dtype; got %g", call->scale);
        if (call->has_softcap && !(low <= call->softcap && call->softcap <= high))
            return fail(err, "softcap_range", "softcap must be in [%g, %g]; got %g", low, high,
                        call->softcap);
    }
    if (!call->has_scale) call->scale = 1.0 / sqrt((double)D);
    call->offset = strcmp(call->alignment, "top_left") == 0 ? 0 : S - L;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The computation (SEMANTICS.md, "The computation, step by step"), one row at a time         */
/* ------------------------------------------------------------------------------------------ */

/* x in the compute dtype: float64 stays, the rest is float32 (a float64 bias of -1e300 is -inf) */
static double ct(const AttentionCall *call, double x) {
    return strcmp(call->dtype, "float64") == 0 ? x : to_float32(x);
}

/* The weights of every row (..., H, L, S) into weights, and whether each (row, key) is allowed
 * into allowed (both prod(scores) long, zeroed by the caller). */
static void weights_of(const AttentionCall *call, const Tensors *a, double *weights, char *allowed) {
    const long H = call->H, G = call->G, L = call->L, S = call->S, D = call->D;
    const int nb = call->nbatch, n = nb + 3;
    const Tensor *q = find(a, "query"), *k = find(a, "key"), *mask = find(a, "mask");
    const Tensor *bias = find(a, "bias"), *q_ids = find(a, "q_segment_ids");
    const Tensor *kv_ids = find(a, "kv_segment_ids"), *sinks = find(a, "sinks");
    const Tensor *slopes = find(a, "alibi_slopes");
    long q_st[MAX_DIMS], k_st[MAX_DIMS], mask_st[MAX_DIMS], bias_st[MAX_DIMS];
    long q_id_st[MAX_DIMS], kv_id_st[MAX_DIMS], at[MAX_DIMS], id_at[MAX_DIMS];
    double *s = malloc(S ? (size_t)S * sizeof(double) : 1);
    strides(q->shape, q->ndim, n, q_st);
    strides(k->shape, k->ndim, n, k_st);
    if (mask) strides(mask->shape, mask->ndim, n, mask_st);
    if (bias) strides(bias->shape, bias->ndim, n, bias_st);
    if (q_ids) strides(q_ids->shape, q_ids->ndim, nb + 1, q_id_st);
    if (kv_ids) strides(kv_ids->shape, kv_ids->ndim, nb + 1, kv_id_st);
    for (size_t b = 0; b < prod(call->batch, nb); b++) {
        multi_index(b, call->batch, nb, at);
        memcpy(id_at, at, sizeof(long) * (size_t)nb);
        for (long h = 0; h < H; h++) {
            for (long i = 0; i < L; i++) {
                const size_t row = ((b * (size_t)H + (size_t)h) * (size_t)L + (size_t)i) * (size_t)S;
                const long diag = i + call->offset;
                size_t q_off;
                double m = -INFINITY, shift, z = 0, sink = 0;
                at[nb] = h, at[nb + 1] = i, at[nb + 2] = 0;
                q_off = dot(at, q_st, n);
                for (long j = 0; j < S; j++) {
                    int ok = 1;
                    double x = 0, bias_j = 0, q_id;
                    size_t k_off;
                    at[nb] = h, at[nb + 1] = i, at[nb + 2] = j;
                    /* 4. allowed: mask AND causal AND window AND same segment, and a bias that
                     *    is not -inf; elsewhere the key is out of the row (s = -inf), never read. */
                    if (mask) ok = mask->data[dot(at, mask_st, n)] != 0;
                    if (call->is_causal) ok = ok && j <= diag;
                    if (call->has_left) ok = ok && j >= diag - call->left; /* (W, 0): W + 1 keys */
                    if (call->has_right) ok = ok && j <= diag + call->right;
                    if (q_ids) {
                        id_at[nb] = i;
                        q_id = q_ids->data[dot(id_at, q_id_st, nb + 1)];
                        id_at[nb] = j;
                        ok = ok && q_id == kv_ids->data[dot(id_at, kv_id_st, nb + 1)];
                    }
                    if (bias) bias_j = ct(call, bias->data[dot(at, bias_st, n)]);
                    if (bias_j == -INFINITY) ok = 0; /* a -inf bias excludes its key, as False does */
                    allowed[row + (size_t)j] = (char)ok;
                    if (!ok) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    /* 1. scores: (query @ key^T) * scale; query head h reads key/value head
                     *    h / G. */
                    at[nb] = h / G, at[nb + 1] = j, at[nb + 2] = 0;
                    k_off = dot(at, k_st, n);
                    for (long d = 0; d < D; d++)
                        x += q->data[q_off + (size_t)(d * q_st[n - 1])] *
                             k->data[k_off + (size_t)(d * k_st[n - 1])];
                    x *= call->scale;
                    /* 2. softcap: softcap * tanh(s / softcap), before bias and mask. */
                    if (call->has_softcap) x = call->softcap * tanh(x / call->softcap);
                    /* 3. additive terms: the bias, then ALiBi's -slope[h] * |i + offset - j|. */
                    x += bias_j;
                    if (slopes) x -= ct(call, slopes->data[h]) * (double)labs(diag - j);
                    s[j] = x;
                }
                /* 5. softmax over S, stable, with the sink (one more logit, no value) in the max
                 *    and the denominator; a row with no allowed key is all zeros, sink or not. */
                for (long j = 0; j < S; j++) m = isnan(m) || isnan(s[j]) ? NAN : fmax(m, s[j]);
                if (sinks) {
                    sink = ct(call, sinks->data[h]);
                    m = isnan(m) || isnan(sink) ? NAN : fmax(m, sink);
                }
                shift = m == -INFINITY ? 0 : m; /* only -inf: a +inf max stays, a NaN row */
                for (long j = 0; j < S; j++) {
                    s[j] = exp(s[j] - shift);
                    z += s[j];
                }
                if (z == 0) continue; /* no allowed key: zeros */
                if (sinks) z += exp(sink - shift);
                for (long j = 0; j < S; j++) weights[row + (size_t)j] = s[j] / z;
            }
        }
    }
    free(s);
}

/* attention_weights(query, key, **arrays, **keywords): the weights (..., H, L, S). */
static void attention_weights(const AttentionCall *call, const Tensors *a, const char *path) {
    long scores[MAX_DIMS];
    int n = call->nbatch + 3;
    size_t size;
    double *weights;
    char *allowed;
    memcpy(scores, call->batch, sizeof(long) * (size_t)call->nbatch);
    scores[n - 3] = call->H, scores[n - 2] = call->L, scores[n - 1] = call->S;
    size = prod(scores, n);
    weights = calloc(size ? size : 1, sizeof(double));
    allowed = calloc(size ? size : 1, 1);
    weights_of(call, a, weights, allowed);
    write_tensor(path, "weights", call->dtype, scores, n, weights);
    free(weights);
    free(allowed);
}

/* scaled_dot_product_attention(query, key, value, **arrays, **keywords): (..., H, L, E). */
static void scaled_dot_product_attention(const AttentionCall *call, const Tensors *a,
                                         const char *path) {
    const long H = call->H, G = call->G, L = call->L, S = call->S, E = call->E;
    const int nb = call->nbatch, n = nb + 3;
    const Tensor *v = find(a, "value");
    long scores[MAX_DIMS], out_shape[MAX_DIMS], v_st[MAX_DIMS], at[MAX_DIMS];
    size_t size;
    double *weights, *out;
    char *allowed;
    memcpy(scores, call->batch, sizeof(long) * (size_t)nb);
    memcpy(out_shape, call->batch, sizeof(long) * (size_t)nb);
    scores[n - 3] = H, scores[n - 2] = L, scores[n - 1] = S;
    out_shape[n - 3] = H, out_shape[n - 2] = L, out_shape[n - 1] = E;
    size = prod(scores, n);
    weights = calloc(size ? size : 1, sizeof(double));
    allowed = calloc(size ? size : 1, 1);
    out = calloc(prod(out_shape, n) ? prod(out_shape, n) : 1, sizeof(double));
    weights_of(call, a, weights, allowed);
    strides(v->shape, v->ndim, n, v_st);
    /* 6. output = weights @ value, over the allowed keys only: a key no query attends, or a
     *    masked one, never reaches the output (0 * NaN would), then back to the input dtype. */
    for (size_t b = 0; b < prod(call->batch, nb); b++) {
        multi_index(b, call->batch, nb, at);
        for (long h = 0; h < H; h++) {
            for (long i = 0; i < L; i++) {
                const size_t row = (b * (size_t)H + (size_t)h) * (size_t)L + (size_t)i;
                double *o = out + row * (size_t)E;
                for (long j = 0; j < S; j++) {
                    const double w = weights[row * (size_t)S + (size_t)j];
                    size_t v_off;
                    if (!allowed[row * (size_t)S + (size_t)j]) continue;
                    at[nb] = h / G, at[nb + 1] = j, at[nb + 2] = 0;
                    v_off = dot(at, v_st, n);
                    for (long e = 0; e < E; e++) o[e] += w * v->data[v_off + (size_t)(e * v_st[n - 1])];
                }
            }
        }
    }
    write_tensor(path, "output", call->dtype, out_shape, n, out);
    free(weights);
    free(allowed);
    free(out);
}

/* causal_mask(q_len, kv_len, alignment=...): bool (L, S), True where j <= i + offset. */
static int causal_mask(const cJSON *kw, const char *path, AttentionError *err) {
    const cJSON *alignment = cJSON_GetObjectItemCaseSensitive(kw, "alignment");
    const cJSON *lens[2] = {cJSON_GetObjectItemCaseSensitive(kw, "q_len"),
                            cJSON_GetObjectItemCaseSensitive(kw, "kv_len")};
    const char *names[2] = {"q_len", "kv_len"};
    long shape[2], offset;
    char text[128];
    double *mask;
    if (alignment != NULL && !cJSON_IsNull(alignment) &&
        (!cJSON_IsString(alignment) || (strcmp(alignment->valuestring, "top_left") != 0 &&
                                        strcmp(alignment->valuestring, "bottom_right") != 0)))
        return fail(err, "unknown_alignment", "alignment must be top_left or bottom_right; got %s",
                    json_text(alignment, text, sizeof text));
    for (int i = 0; i < 2; i++) {
        if (!is_int(lens[i]) || lens[i]->valuedouble < 0)
            return fail(err, "non_positive_size", "%s must be an integer >= 0; got %s", names[i],
                        json_text(lens[i], text, sizeof text));
        shape[i] = (long)lens[i]->valuedouble;
    }
    offset = cJSON_IsString(alignment) && strcmp(alignment->valuestring, "bottom_right") == 0
                 ? shape[1] - shape[0]
                 : 0;
    mask = malloc(prod(shape, 2) ? prod(shape, 2) * sizeof(double) : 1);
    for (long i = 0; i < shape[0]; i++)
        for (long j = 0; j < shape[1]; j++) mask[i * shape[1] + j] = j <= i + offset;
    write_tensor(path, "mask", "bool", shape, 2, mask);
    free(mask);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The protocol loop                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* The answer to one request: {"output": PATH}, {"error": {...}} or {"unsupported": why}. */
static cJSON *answer(const cJSON *request) {
    const cJSON *function = cJSON_GetObjectItemCaseSensitive(request, "function");
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(request, "inputs");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(request, "keywords");
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(request, "output");
    cJSON *reply = cJSON_CreateObject();
    AttentionError err = {NULL, ""};
    AttentionCall call;
    Tensors arrays; /* null_inputs: not in the file, so not given (find gives NULL) */
    const char *unsupported;
    if (!cJSON_IsString(function) || !cJSON_IsString(output)) die("a malformed request", "?");
    arrays.n = 0;
    if (cJSON_IsString(inputs) && (unsupported = read_tensors(inputs->valuestring, &arrays))) {
        cJSON_AddStringToObject(reply, "unsupported", unsupported);
        return reply;
    }
    if (strcmp(function->valuestring, "causal_mask") == 0) {
        causal_mask(kw, output->valuestring, &err);
    } else {
        const int sdpa = strcmp(function->valuestring, "sdpa") == 0;
        if (!check_keywords(kw, &call, &err) && !check_arrays(&call, &arrays, sdpa, &err)) {
            if (sdpa) scaled_dot_product_attention(&call, &arrays, output->valuestring);
            else attention_weights(&call, &arrays, output->valuestring);
        }
    }
    free_tensors(&arrays);
    if (err.code != NULL) {
        cJSON *error = cJSON_AddObjectToObject(reply, "error");
        cJSON_AddStringToObject(error, "class", class_of(err.code));
        cJSON_AddStringToObject(error, "code", err.code);
        cJSON_AddStringToObject(error, "message", err.message);
    } else {
        cJSON_AddStringToObject(reply, "output", output->valuestring);
    }
    return reply;
}

/* One line of stdin, without its newline, in a buffer that grows; NULL at the end. */
static char *read_line(char **buffer, size_t *size) {
    size_t at = 0;
    if (*buffer == NULL) *buffer = malloc(*size = 1 << 16);
    while (fgets(*buffer + at, (int)(*size - at), stdin) != NULL) {
        at += strlen(*buffer + at);
        if (at > 0 && (*buffer)[at - 1] == '\n') {
            (*buffer)[at - 1] = '\0';
            return *buffer;
        }
        if (at + 1 == *size) *buffer = realloc(*buffer, *size *= 2);
    }
    return at ? *buffer : NULL;
}

int main(void) {
    char *buffer = NULL, *line;
    size_t size = 0;
    puts("{\"protocol\": 1, \"functions\": [\"sdpa\", \"weights\", \"causal_mask\"]}");
    fflush(stdout);
    while ((line = read_line(&buffer, &size)) != NULL) {
        cJSON *request, *reply;
        char *text;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        if ((request = cJSON_Parse(line)) == NULL) die("a request that is not JSON", line);
        reply = answer(request);
        text = cJSON_PrintUnformatted(reply);
        puts(text);
        fflush(stdout);
        free(text);
        cJSON_Delete(reply);
        cJSON_Delete(request);
    }
    free(buffer);
    return 0;
}
