#!/usr/bin/env node
// The attention contract (docs/SEMANTICS.md, v1 and v2) in plain JavaScript for node, no
// packages: scaled_dot_product_attention, attention_weights and causal_mask for float64, float32,
// float16 and bfloat16, with the same numbered steps as impl_numpy/functional.py. Checked by
//
//     python -m conformance --exec "node conformance/ports/js/port.js"
//
// over the line protocol of conformance/PORTING.md ("Any language: --exec"): one JSON request
// per run on stdin, one JSON answer on stdout; arrays in safetensors files (conformance/
// FORMAT.md, "Dtypes" and "safetensors"), read and written here by hand. What it does not do is
// in port.xfails, next to it. Everything is computed in float64 (a JavaScript number: at least
// the contract's compute dtype, float32 for float32, float16 and bfloat16 inputs) and rounded
// once to the input dtype at the end; bias, sinks and slopes are first rounded to the compute
// dtype, as the contract says.
"use strict";

const fs = require("fs");
const readline = require("readline");

// ---------------------------------------------------------------------------------------------
// Errors: the taxonomy's class of each code this port raises (attention_spec.ERROR_CODES).
// ---------------------------------------------------------------------------------------------

const CLASSES = {
  DimensionMismatchError: ["rank", "qk_head_dim_mismatch", "kv_heads_mismatch",
    "kv_length_mismatch", "heads_not_divisible", "batch_not_broadcastable", "sinks_shape",
    "alibi_shape"],
  DTypeError: ["unsupported_dtype", "dtype_mismatch", "sinks_dtype", "alibi_dtype",
    "not_an_array"],
  MaskError: ["mask_dtype", "bias_dtype", "mask_kv_heads", "bias_kv_heads", "mask_shape",
    "bias_shape", "segment_ids_dtype", "segment_ids_shape"],
  ConfigError: ["non_positive_size", "segment_ids_pair", "scale_range", "softcap_range",
    "not_a_bool", "unknown_alignment", "scale_not_finite", "softcap_not_positive",
    "window_value"],
};
const CLASS_OF = {};
for (const [cls, codes] of Object.entries(CLASSES)) for (const c of codes) CLASS_OF[c] = cls;

class AttentionError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
    this.cls = CLASS_OF[code];
  }
}
const fail = (code, message) => { throw new AttentionError(code, message); };

// ---------------------------------------------------------------------------------------------
// safetensors: 8-byte little-endian header length, a JSON header, the data (FORMAT.md).
// ---------------------------------------------------------------------------------------------

const TAGS = { F64: "float64", F32: "float32", F16: "float16", BF16: "bfloat16", BOOL: "bool",
  I32: "int32", I64: "int64" };
const TAG_OF = Object.fromEntries(Object.entries(TAGS).map(([t, d]) => [d, t]));

function halfToNumber(h) { // IEEE binary16 bits -> number
  const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

function decode(dtype, bytes) { // the elements as numbers (bools as true/false)
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const size = { float64: 8, float32: 4, float16: 2, bfloat16: 2, bool: 1, int32: 4, int64: 8 };
  const n = bytes.byteLength / size[dtype], out = new Array(n);
  const f32 = new DataView(new ArrayBuffer(4));
  for (let i = 0; i < n; i++) {
    switch (dtype) {
      case "float64": out[i] = view.getFloat64(8 * i, true); break;
      case "float32": out[i] = view.getFloat32(4 * i, true); break;
      case "float16": out[i] = halfToNumber(view.getUint16(2 * i, true)); break;
      case "bfloat16": f32.setUint32(0, view.getUint16(2 * i, true) << 16); out[i] = f32.getFloat32(0); break;
      case "bool": out[i] = view.getUint8(i) !== 0; break;
      case "int32": out[i] = view.getInt32(4 * i, true); break;
      case "int64": out[i] = Number(view.getBigInt64(8 * i, true)); break;
    }
  }
  return out;
}

function readTensors(path) { // name -> {dtype, shape, data}
  const file = fs.readFileSync(path);
  const n = Number(file.readBigUInt64LE(0));
  const header = JSON.parse(file.subarray(8, 8 + n).toString("utf8"));
  const tensors = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [begin, end] = info.data_offsets;
    const dtype = TAGS[info.dtype];
    tensors[name] = { dtype, shape: info.shape, data: decode(dtype, file.subarray(8 + n + begin, 8 + n + end)) };
  }
  return tensors;
}

// A number rounded to nearest-even with p significant bits, exponents down to emin (below:
// subnormal), beyond maxFinite: infinite. float16: (11, -14, 65504); bfloat16: (8, -126, ...).
function roundTo(x, p, emin, maxFinite) {
  if (!Number.isFinite(x) || x === 0) return x;
  const a = Math.abs(x);
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (2 ** (e + 1) <= a) e++;
  const quantum = 2 ** (Math.max(e, emin) - p + 1), y = a / quantum, n = Math.floor(y);
  const r = (y - n > 0.5 || (y - n === 0.5 && n % 2 === 1) ? n + 1 : n) * quantum;
  return Math.sign(x) * (r > maxFinite ? Infinity : r);
}

function halfBits(x) { // a number -> IEEE binary16 bits, rounded to nearest-even
  const r = roundTo(x, 11, -14, 65504), sign = r < 0 || Object.is(r, -0) ? 0x8000 : 0;
  const a = Math.abs(r);
  if (Number.isNaN(r)) return 0x7e00;
  if (a === Infinity) return sign | 0x7c00;
  if (a < 2 ** -14) return sign | (a / 2 ** -24); // subnormal (or zero)
  const e = Math.floor(Math.log2(a));
  return sign | ((e + 15) << 10) | ((a / 2 ** e - 1) * 1024);
}

function bfloat16Bits(x) { // a number -> bfloat16 bits (the upper half of a float32)
  const f32 = new DataView(new ArrayBuffer(4));
  f32.setFloat32(0, Number.isNaN(x) ? NaN : roundTo(x, 8, -126, 3.3895313892515355e38));
  return f32.getUint32(0) >>> 16;
}

function writeTensors(path, tensors) { // tensors: name -> {dtype, shape, data}
  const size = { float64: 8, float32: 4, float16: 2, bfloat16: 2, bool: 1 };
  const header = {}, parts = [];
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const bytes = Buffer.alloc(t.data.length * size[t.dtype]);
    t.data.forEach((x, i) => {
      if (t.dtype === "float64") bytes.writeDoubleLE(x, 8 * i);
      else if (t.dtype === "float32") bytes.writeFloatLE(x, 4 * i); // rounds to nearest
      else if (t.dtype === "float16") bytes.writeUInt16LE(halfBits(x), 2 * i);
      else if (t.dtype === "bfloat16") bytes.writeUInt16LE(bfloat16Bits(x), 2 * i);
      else bytes.writeUInt8(x ? 1 : 0, i);
    });
    header[name] = { dtype: TAG_OF[t.dtype], shape: t.shape, data_offsets: [offset, offset + bytes.length] };
    parts.push(bytes);
    offset += bytes.length;
  }
  let text = JSON.stringify(header);
  text += " ".repeat((8 - (text.length % 8)) % 8); // the header padded to 8 bytes
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(Buffer.byteLength(text)));
  fs.writeFileSync(path, Buffer.concat([length, Buffer.from(text, "utf8"), ...parts]));
}

// ---------------------------------------------------------------------------------------------
// Shapes and broadcasting
// ---------------------------------------------------------------------------------------------

const prod = (shape) => shape.reduce((a, b) => a * b, 1);

function broadcastShapes(...shapes) { // NumPy's right-aligned broadcast, or null
  const ndim = Math.max(0, ...shapes.map((s) => s.length)), out = [];
  for (let axis = -ndim; axis < 0; axis++) {
    const sizes = new Set(shapes.filter((s) => s.length >= -axis).map((s) => s[s.length + axis]));
    sizes.delete(1);
    if (sizes.size > 1) return null;
    out.push(sizes.size ? [...sizes][0] : 1);
  }
  return out;
}

const fits = (shape, target) => shape.length <= target.length &&
  shape.every((n, a) => n === 1 || n === target[target.length - shape.length + a]);

// strides of `shape` read at a multi-index of `target` (right-aligned, 0 where broadcast)
function strides(shape, target) {
  const out = new Array(target.length).fill(0);
  let stride = 1;
  for (let a = shape.length - 1; a >= 0; a--) {
    const t = target.length - shape.length + a;
    out[t] = shape[a] === 1 ? 0 : stride;
    stride *= shape[a];
  }
  return out;
}

const dot = (index, st) => index.reduce((sum, i, a) => sum + i * st[a], 0);

function multiIndex(flat, shape) {
  const index = new Array(shape.length);
  for (let a = shape.length - 1; a >= 0; a--) { index[a] = flat % shape[a]; flat = Math.floor(flat / shape[a]); }
  return index;
}

// ---------------------------------------------------------------------------------------------
// Validation, in the contract's order (SEMANTICS.md, "Errors"): keywords on their own; query,
// key and value; each array keyword against the sizes; scale and softcap in the compute dtype.
// ---------------------------------------------------------------------------------------------

const FLOATS = ["float64", "float32", "float16", "bfloat16"];
const isInt = (x) => typeof x === "number" && Number.isInteger(x);
function real(x) { // a keyword number: JSON's number, or {"float": "inf" | "-inf" | "nan"}
  if (x !== null && typeof x === "object" && Object.keys(x).length === 1 && "float" in x) {
    return { inf: Infinity, "-inf": -Infinity, nan: NaN }[x.float];
  }
  return x;
}

function checkKeywords(kw) {
  const call = {};
  call.is_causal = "is_causal" in kw ? kw.is_causal : false; // null is None: not a bool
  if (typeof call.is_causal !== "boolean") fail("not_a_bool", `is_causal must be a bool; got ${JSON.stringify(call.is_causal)}`);
  call.alignment = "causal_alignment" in kw ? kw.causal_alignment : "top_left";
  if (!["top_left", "bottom_right"].includes(call.alignment)) fail("unknown_alignment", `causal_alignment must be top_left or bottom_right; got ${JSON.stringify(call.alignment)}`);
  call.scale = real(kw.scale ?? null);
  if (call.scale !== null && (typeof call.scale !== "number" || !Number.isFinite(call.scale))) fail("scale_not_finite", `scale must be a finite real number; got ${call.scale}`);
  call.softcap = real(kw.softcap ?? null);
  if (call.softcap !== null && (typeof call.softcap !== "number" || !(call.softcap > 0) || !Number.isFinite(call.softcap))) fail("softcap_not_positive", `softcap must be a finite number > 0; got ${call.softcap}`);
  const w = kw.window ?? null;
  call.window = null;
  if (w !== null) {
    const ok = Array.isArray(w) && w.length === 2 && w.every((side) => side === null || (isInt(side) && side >= 0));
    if (!ok) fail("window_value", `window must be a pair (left, right) of integers >= 0 or null; got ${JSON.stringify(w)}`);
    if (w[0] !== null || w[1] !== null) call.window = w;
  }
  return call;
}

function checkArrays(call, a, withValue) {
  const { query: q, key: k } = a, v = withValue ? a.value : undefined;
  for (const [name, x] of Object.entries({ query: q, key: k, ...(withValue ? { value: v } : {}) })) {
    if (x === null || x === undefined) fail("not_an_array", `${name} must be an array; got None`);
  }
  for (const [name, x] of [["query", q], ["key", k], ...(v ? [["value", v]] : [])]) {
    if (x.shape.length < 3) fail("rank", `${name} must have at least 3 dims; got ${JSON.stringify(x.shape)}`);
  }
  if (!FLOATS.includes(q.dtype)) fail("unsupported_dtype", `query dtype must be floating; got ${q.dtype}`);
  if (k.dtype !== q.dtype || (v && v.dtype !== q.dtype)) fail("dtype_mismatch", "query, key and value must share one dtype");
  const [H, L, D] = q.shape.slice(-3), [K, S, Dk] = k.shape.slice(-3);
  const [Kv, Sv, E] = v ? v.shape.slice(-3) : [K, S, 1];
  for (const [what, n] of [["H", H], ["K", K], ["value K", Kv], ["D", D], ["E", E]]) {
    if (n < 1) fail("non_positive_size", `${what} must be >= 1; got ${n}`);
  }
  if (Dk !== D) fail("qk_head_dim_mismatch", `query head dim ${D} != key head dim ${Dk}`);
  if (v && Kv !== K) fail("kv_heads_mismatch", `key heads ${K} != value heads ${Kv}`);
  if (v && Sv !== S) fail("kv_length_mismatch", `key length ${S} != value length ${Sv}`);
  if (H % K) fail("heads_not_divisible", `key heads (K=${K}) must divide query heads (H=${H})`);
  const batch = broadcastShapes(q.shape.slice(0, -3), k.shape.slice(0, -3), ...(v ? [v.shape.slice(0, -3)] : []));
  if (batch === null) fail("batch_not_broadcastable", "leading batch dims must broadcast");
  Object.assign(call, { batch, H, K, G: H / K, L, S, D, E, dtype: q.dtype });

  const scores = [...batch, H, L, S];
  for (const kind of ["mask", "bias"]) {
    const x = a[kind];
    if (!x) continue;
    if (kind === "mask" && x.dtype !== "bool") fail("mask_dtype", `mask must be boolean; got ${x.dtype} (pass a float mask as bias=)`);
    if (kind === "bias" && !FLOATS.includes(x.dtype)) fail("bias_dtype", `bias must be floating; got ${x.dtype}`);
    const s = x.shape;
    if (s.length >= 3 && s[s.length - 3] === K && K !== 1 && K !== H) fail(`${kind}_kv_heads`, `${kind} head axis has size K=${K}; it must be 1 or H=${H}`);
    if (!fits(s, scores)) fail(`${kind}_shape`, `${kind} must broadcast to ${JSON.stringify(scores)}; got ${JSON.stringify(s)}`);
  }
  const qIds = a.q_segment_ids, kvIds = a.kv_segment_ids;
  if (!!qIds !== !!kvIds) fail("segment_ids_pair", "give both q_segment_ids and kv_segment_ids, or neither");
  for (const [side, ids, n] of [["q", qIds, L], ["kv", kvIds, S]]) {
    if (!ids) continue;
    if (!ids.dtype.startsWith("int")) fail("segment_ids_dtype", `${side}_segment_ids must be integers; got ${ids.dtype}`);
    if (!fits(ids.shape, [...batch, n])) fail("segment_ids_shape", `${side}_segment_ids must broadcast to ${JSON.stringify([...batch, n])}`);
  }
  for (const [name, short] of [["sinks", "sinks"], ["alibi_slopes", "alibi"]]) {
    const x = a[name];
    if (!x) continue;
    if (x.shape.length !== 1 || x.shape[0] !== H) fail(`${short}_shape`, `${name} must have shape (H=${H},); got ${JSON.stringify(x.shape)}`);
    if (!FLOATS.includes(x.dtype)) fail(`${short}_dtype`, `${name} must be floating; got ${x.dtype}`);
  }
  const ct64 = q.dtype === "float64";
  const finiteMax = ct64 ? 1.7976931348623157e308 : 3.4028234663852886e38;
  if (call.scale !== null && !(Math.abs(call.scale) <= finiteMax)) fail("scale_range", `scale must be finite in the compute dtype; got ${call.scale}`);
  const [low, high] = ct64 ? [2 ** -969, 2 ** 969] : [2 ** -102, 2 ** 102];
  if (call.softcap !== null && !(low <= call.softcap && call.softcap <= high)) fail("softcap_range", `softcap must be in [${low}, ${high}]; got ${call.softcap}`);
  if (call.scale === null) call.scale = 1 / Math.sqrt(D);
  call.offset = call.alignment === "top_left" ? 0 : S - L; // query i's diagonal is key i + offset
  return call;
}

// ---------------------------------------------------------------------------------------------
// The computation (SEMANTICS.md, "The computation, step by step"), one row at a time
// ---------------------------------------------------------------------------------------------

// The weights of every row (..., H, L, S), and whether each (row, key) is allowed.
function weightsOf(call, a) {
  const { batch, H, G, L, S, D } = call;
  const scores = [...batch, H, L, S];
  const [q, k] = [a.query, a.key];
  const qSt = strides(q.shape, [...batch, H, L, D]), kSt = strides(k.shape, [...batch, call.K, S, D]);
  const maskSt = a.mask && strides(a.mask.shape, scores), biasSt = a.bias && strides(a.bias.shape, scores);
  const qIdSt = a.q_segment_ids && strides(a.q_segment_ids.shape, [...batch, L]);
  const kvIdSt = a.kv_segment_ids && strides(a.kv_segment_ids.shape, [...batch, S]);
  const [left, right] = call.window ?? [null, null];
  // bias, sinks and slopes in the compute dtype: a float64 bias of -1e300 is -inf in float32
  const ct = call.dtype === "float64" ? (x) => x : Math.fround;
  const weights = new Array(prod(scores)).fill(0), allowed = new Array(prod(scores)).fill(false);
  const s = new Array(S);
  for (let b = 0; b < prod(batch); b++) {
    const bi = multiIndex(b, batch);
    for (let h = 0; h < H; h++) {
      for (let i = 0; i < L; i++) {
        const row = ((b * H + h) * L + i) * S;
        const qOff = dot([...bi, h, i, 0], qSt);
        for (let j = 0; j < S; j++) {
          const at = [...bi, h, i, j], diag = i + call.offset;
          // 4. allowed: mask AND causal AND window AND same segment, and a bias that is not
          //    -inf; elsewhere the key is out of the row (s = -inf), never read.
          let ok = !a.mask || a.mask.data[dot(at, maskSt)];
          if (call.is_causal) ok = ok && j <= diag;
          if (left !== null) ok = ok && j >= diag - left; // inclusive: (W, 0) sees W + 1 keys
          if (right !== null) ok = ok && j <= diag + right;
          if (qIdSt) ok = ok && a.q_segment_ids.data[dot([...bi, i], qIdSt)] === a.kv_segment_ids.data[dot([...bi, j], kvIdSt)];
          const bias = a.bias ? ct(a.bias.data[dot(at, biasSt)]) : 0;
          if (bias === -Infinity) ok = false; // a -inf bias excludes its key, as a False mask does
          allowed[row + j] = ok;
          if (!ok) { s[j] = -Infinity; continue; }
          // 1. scores: (query @ key^T) * scale; query head h reads key/value head h // G.
          const kOff = dot([...bi, Math.floor(h / G), j, 0], kSt);
          let x = 0;
          for (let d = 0; d < D; d++) x += q.data[qOff + d * qSt[qSt.length - 1]] * k.data[kOff + d * kSt[kSt.length - 1]];
          x *= call.scale;
          // 2. softcap: softcap * tanh(s / softcap), before bias and mask.
          if (call.softcap !== null) x = call.softcap * Math.tanh(x / call.softcap);
          // 3. additive terms: the bias, then ALiBi's -slope[h] * |i + offset - j|.
          x += bias;
          if (a.alibi_slopes) x -= ct(a.alibi_slopes.data[h]) * Math.abs(diag - j);
          s[j] = x;
        }
        // 5. softmax over S, stable, with the sink (one more logit, no value) in the max and
        //    the denominator; a row with no allowed key is all zeros, sink or not.
        let m = Math.max(-Infinity, ...s);
        const sink = a.sinks ? ct(a.sinks.data[h]) : null;
        if (sink !== null) m = Math.max(m, sink);
        const shift = m === -Infinity ? 0 : m; // only -inf: a +inf max stays, a NaN row
        let z = 0;
        for (let j = 0; j < S; j++) { s[j] = Math.exp(s[j] - shift); z += s[j]; }
        if (z === 0) continue; // no allowed key: zeros
        if (sink !== null) z += Math.exp(sink - shift);
        for (let j = 0; j < S; j++) weights[row + j] = s[j] / z;
      }
    }
  }
  return { weights, allowed, scores };
}

function attentionWeights(a, kw) {
  const call = checkArrays(checkKeywords(kw), a, false);
  const { weights, scores } = weightsOf(call, a);
  return { weights: { dtype: call.dtype, shape: scores, data: weights } };
}

function scaledDotProductAttention(a, kw) {
  const call = checkArrays(checkKeywords(kw), a, true);
  const { weights, allowed } = weightsOf(call, a);
  const { batch, H, G, L, S, E } = call, v = a.value;
  const vSt = strides(v.shape, [...batch, call.K, S, E]);
  const out = new Array(prod([...batch, H, L, E])).fill(0);
  // 6. output = weights @ value, over the allowed keys only: a key no query attends, or a
  //    masked one, never reaches the output (0 * NaN would), then back to the input dtype.
  for (let b = 0; b < prod(batch); b++) {
    const bi = multiIndex(b, batch);
    for (let h = 0; h < H; h++) {
      for (let i = 0; i < L; i++) {
        const row = ((b * H + h) * L + i), o = row * E;
        for (let j = 0; j < S; j++) {
          if (!allowed[row * S + j]) continue;
          const w = weights[row * S + j], vOff = dot([...bi, Math.floor(h / G), j, 0], vSt);
          for (let e = 0; e < E; e++) out[o + e] += w * v.data[vOff + e * vSt[vSt.length - 1]];
        }
      }
    }
  }
  return { output: { dtype: call.dtype, shape: [...batch, H, L, E], data: out } };
}

function causalMask(kw) {
  const { q_len: L, kv_len: S } = kw, alignment = kw.alignment ?? "top_left";
  if (!["top_left", "bottom_right"].includes(alignment)) fail("unknown_alignment", `alignment must be top_left or bottom_right; got ${JSON.stringify(alignment)}`);
  for (const [name, n] of [["q_len", L], ["kv_len", S]]) {
    if (!isInt(n) || n < 0) fail("non_positive_size", `${name} must be an integer >= 0; got ${n}`);
  }
  const offset = alignment === "top_left" ? 0 : S - L, data = [];
  for (let i = 0; i < L; i++) for (let j = 0; j < S; j++) data.push(j <= i + offset);
  return { mask: { dtype: "bool", shape: [L, S], data } };
}

// ---------------------------------------------------------------------------------------------
// The protocol loop
// ---------------------------------------------------------------------------------------------

const COMPUTED = ["float64", "float32", "float16", "bfloat16"]; // every dtype of the contract

function answer(request) {
  const arrays = request.inputs ? readTensors(request.inputs) : {};
  for (const name of request.null_inputs) arrays[name] = null;
  const kw = request.keywords;
  try {
    let result;
    if (request.function === "causal_mask") result = causalMask(kw);
    else {
      const sdpa = request.function === "sdpa";
      const call = checkArrays(checkKeywords(kw), arrays, sdpa); // errors before the dtype gap
      if (!COMPUTED.includes(call.dtype)) return { unsupported: `${call.dtype} inputs` };
      result = sdpa ? scaledDotProductAttention(arrays, kw) : attentionWeights(arrays, kw);
    }
    writeTensors(request.output, result);
    return { output: request.output };
  } catch (exc) {
    if (!(exc instanceof AttentionError)) throw exc;
    return { error: { class: exc.cls, code: exc.code, message: exc.message } };
  }
}

function main() {
  const send = (message) => process.stdout.write(JSON.stringify(message) + "\n");
  send({ protocol: 1, functions: ["sdpa", "weights", "causal_mask"] });
  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  lines.on("line", (line) => { if (line.trim()) send(answer(JSON.parse(line))); });
}

if (require.main === module) main();
module.exports = { scaledDotProductAttention, attentionWeights, causalMask, readTensors, writeTensors };
