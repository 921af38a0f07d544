// The attention visualizer (docs/site/visualizer.py writes its data into the page).
// The tiny model runs here in float64 as impl_numpy's modules run it: per layer, projections,
// RoPE, causal attention, the output projection and the residual. The picked head's weights at
// temperature tau are then what impl_numpy.attention_weights computes with
// scale = 1/sqrt(D) / tau: scores, allowed (causal, padding, window), a stable softmax, a row
// with no allowed key left at zeros. Then the heatmap and each row's entropy.
(() => {
  "use strict";
  const data = JSON.parse(document.getElementById("viz-data").textContent);
  const el = (id) => document.getElementById(id);
  // The exported decimals read back as the float32 values of the committed weights.
  const f32 = (x) => (Array.isArray(x) ? x.map(f32) : Math.fround(x));
  const embed = f32(data.embed); // (V, M)
  const layers = data.weights.map((w) => Object.fromEntries(Object.entries(w).map(([k, v]) => [k, f32(v)])));
  const H = data.heads;
  const K = data.kvHeads;
  const D = data.headDim;
  const P = D / 2;
  const invFreq = Array.from({ length: P }, (_, p) => data.ropeTheta ** ((-2 * p) / D)); // (P,)

  function linear(x, kernel, bias) {
    // x (N, in) @ kernel (in, out) + bias (out,)
    const out = kernel[0].length;
    return x.map((row) => {
      const y = new Array(out);
      for (let o = 0; o < out; o++) {
        let s = 0;
        for (let i = 0; i < row.length; i++) s += row[i] * kernel[i][o];
        y[o] = s + bias[o];
      }
      return y;
    });
  }

  function splitHeads(y, n) {
    // (N, n*D) -> (n, N, D): head h is features [h*D, (h+1)*D)
    return Array.from({ length: n }, (_, h) => y.map((row) => row.slice(h * D, (h + 1) * D)));
  }

  function rotate(x) {
    // RoPE, pairs (x[p], x[p + D/2]), token i at position i
    return x.map((head) =>
      head.map((v, i) => {
        const y = new Array(D);
        for (let p = 0; p < P; p++) {
          const a = i * invFreq[p];
          const c = Math.cos(a);
          const s = Math.sin(a);
          y[p] = v[p] * c - v[p + P] * s;
          y[p + P] = v[p + P] * c + v[p] * s;
        }
        return y;
      })
    );
  }

  function weights(q, k, scale, allowed) {
    // q (N, D), k (S, D) of one head -> (N, S)
    return q.map((qi, i) => {
      // 1. scores, 4. allowed
      const s = k.map((kj, j) => {
        if (!allowed(i, j)) return -Infinity;
        let dot = 0;
        for (let d = 0; d < D; d++) dot += qi[d] * kj[d];
        return dot * scale;
      });
      // 5. softmax over S, stable; a row with no allowed key stays zeros
      const max = Math.max(...s);
      if (max === -Infinity) return s.map(() => 0);
      const e = s.map((x) => (x === -Infinity ? 0 : Math.exp(Math.min(x - max, 0))));
      const sum = e.reduce((a, b) => a + b, 0);
      return e.map((x) => x / sum);
    });
  }

  const cache = new Map();
  function forward(tokens) {
    // per layer: q (H, N, D) and k (K, N, D) after RoPE
    const key = tokens.join(" ");
    if (cache.has(key)) return cache.get(key);
    let h = tokens.map((t) => embed[t].slice()); // (N, M)
    const qs = [];
    const ks = [];
    for (const w of layers) {
      const q = rotate(splitHeads(linear(h, w["q_proj.kernel"], w["q_proj.bias"]), H));
      const k = rotate(splitHeads(linear(h, w["k_proj.kernel"], w["k_proj.bias"]), K));
      const v = splitHeads(linear(h, w["v_proj.kernel"], w["v_proj.bias"]), K);
      const merged = h.map(() => []); // (N, H*E)
      for (let head = 0; head < H; head++) {
        const kv = Math.floor(head / (H / K));
        const a = weights(q[head], k[kv], data.scale, (i, j) => j <= i);
        a.forEach((row, i) => {
          for (let e = 0; e < D; e++) merged[i].push(row.reduce((acc, x, j) => acc + x * v[kv][j][e], 0));
        });
      }
      const y = linear(merged, w["o_proj.kernel"], w["o_proj.bias"]);
      h = h.map((row, i) => row.map((x, m) => x + y[i][m]));
      qs.push(q);
      ks.push(k);
    }
    const out = { q: qs, k: ks };
    cache.set(key, out);
    return out;
  }

  function entropy(row) {
    return -row.reduce((a, w) => (w > 0 ? a + w * Math.log(w) : a), 0);
  }

  function colour(w) {
    // white -> dark blue
    const t = Math.sqrt(w); // small weights stay visible
    const c = (a, b) => Math.round(a + (b - a) * t);
    return `rgb(${c(255, 8)}, ${c(255, 48)}, ${c(255, 107)})`;
  }

  function readInt(input, fallback) {
    const v = parseInt(input.value, 10);
    return Number.isFinite(v) && v >= 0 ? v : fallback;
  }

  function parseTokens(text) {
    const parts = text.split(/[\s,]+/).filter((x) => x !== "");
    const tokens = parts.map(Number);
    const bad = parts.filter((x, i) => !/^\d+$/.test(x) || tokens[i] >= data.vocab);
    if (bad.length) return { error: `not a token (0 to ${data.vocab - 1}): ${bad.join(" ")}` };
    if (!tokens.length || tokens.length > data.maxTokens) {
      return { error: `give 1 to ${data.maxTokens} tokens (${tokens.length} given)` };
    }
    return { tokens };
  }

  function targets(tokens) {
    // per query, the key after the previous occurrence of its token (-1: none)
    return tokens.map((t, i) => {
      const j = tokens.lastIndexOf(t, i - 1);
      return i > 0 && j >= 0 ? j + 1 : -1;
    });
  }

  function draw() {
    const table = el("viz-heatmap");
    const parsed = parseTokens(el("viz-tokens").value);
    if (parsed.error) {
      table.innerHTML = "";
      table.dataset.error = parsed.error;
      el("viz-summary").textContent = parsed.error;
      return;
    }
    delete table.dataset.error;
    const tokens = parsed.tokens;
    const [layer, head] = el("viz-head").value.split(":").map((x) => parseInt(x, 10));
    const tau = tauOf(parseInt(el("viz-tau").value, 10));
    const causal = el("viz-causal").checked;
    const n = tokens.length;
    const padding = Math.min(readInt(el("viz-padding"), 0), n);
    const window = el("viz-window").value === "" ? null : readInt(el("viz-window"), null);
    const { q, k } = forward(tokens);
    const allowed = (i, j) =>
      (!causal || j <= i) && j < n - padding && (window === null || Math.abs(i - j) <= window);
    const kv = Math.floor(head / (H / K));
    const w = weights(q[layer][head], k[layer][kv], data.scale / tau, allowed);
    const h = w.map(entropy);

    const out = el("viz-tau-value");
    out.textContent = tau.toFixed(3);
    out.dataset.tau = String(tau);
    Object.assign(table.dataset, {
      tokens: tokens.join(" "),
      layer: String(layer),
      head: String(head),
      tau: String(tau),
      causal: String(causal),
      padding: String(padding),
      window: window === null ? "" : String(window),
    });
    const keys = tokens
      .map((t, j) => `<th class="key${j >= n - padding ? " padded" : ""}" title="key ${j}">${t}</th>`)
      .join("");
    const rows = [
      `<tr><th class="corner" title="query (rows) by key (columns)">q\\k</th>${keys}<th class="entropy">entropy</th></tr>`,
    ];
    const target = layer === data.layers - 1 ? targets(tokens) : tokens.map(() => -1);
    for (let i = 0; i < n; i++) {
      const cells = w[i]
        .map((x, j) => {
          const cls = j === target[i] ? ' class="target"' : "";
          const title = `query ${i} (token ${tokens[i]}) -> key ${j} (token ${tokens[j]}): ${x.toFixed(6)}`;
          return `<td${cls} data-w="${x}" style="background:${colour(x)}" title="${title}"></td>`;
        })
        .join("");
      rows.push(
        `<tr class="row"><th class="query" title="query ${i}">${tokens[i]}</th>${cells}` +
          `<td class="entropy" data-h="${h[i]}">${h[i].toFixed(3)}</td></tr>`
      );
    }
    table.innerHTML = rows.join("");
    const meanMax = w.map((r) => Math.max(...r)).reduce((a, b) => a + b, 0) / n;
    const meanH = h.reduce((a, b) => a + b, 0) / n;
    el("viz-summary").textContent =
      `layer ${layer + 1}, head ${head}, tau = ${tau.toFixed(3)}: mean of the rows' largest ` +
      `weight ${meanMax.toFixed(3)}, mean entropy ${meanH.toFixed(3)} nats (uniform over ${n} ` +
      `keys: ${Math.log(n).toFixed(3)})`;
  }

  function tauOf(position) {
    return 2 ** (position / data.slider.stepsPerOctave);
  }

  el("viz-prompt").addEventListener("change", () => {
    el("viz-tokens").value = data.prompts[parseInt(el("viz-prompt").value, 10)].tokens.join(" ");
    draw();
  });
  for (const id of ["viz-tokens", "viz-head", "viz-tau", "viz-causal", "viz-padding", "viz-window"]) {
    el(id).addEventListener("input", draw);
    el(id).addEventListener("change", draw);
  }
  draw();
})();
