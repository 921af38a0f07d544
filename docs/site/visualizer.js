// The attention visualizer (docs/site/visualizer.py writes its data into the page).
// One head's weights at temperature tau, in float64, as impl_numpy.attention_weights computes
// them with scale = 1/sqrt(D) / tau: scores, allowed (causal, padding, window), a stable
// softmax, a row with no allowed key left at zeros. Then the heatmap and each row's entropy.
(() => {
  "use strict";
  const data = JSON.parse(document.getElementById("viz-data").textContent);
  const el = (id) => document.getElementById(id);
  // The exported decimals read back as the float32 values the model computed.
  const f32 = (rows) => rows.map((r) => r.map(Math.fround)); // (N, D)
  for (const p of data.prompts) {
    p.q = p.q.map((layer) => layer.map(f32));
    p.k = p.k.map((layer) => layer.map(f32));
  }

  function tauOf(position) {
    return 2 ** (position / data.slider.stepsPerOctave);
  }

  function weights(prompt, layer, head, tau, causal, padding, window) {
    const q = prompt.q[layer][head]; // (N, D)
    const k = prompt.k[layer][Math.floor(head / (data.heads / data.kvHeads))]; // (N, D)
    const n = q.length;
    const scale = data.scale / tau;
    const out = [];
    for (let i = 0; i < n; i++) {
      // 1. scores, 4. allowed
      const s = new Array(n).fill(-Infinity);
      for (let j = 0; j < n; j++) {
        const ok =
          (!causal || j <= i) && j < n - padding && (window === null || Math.abs(i - j) <= window);
        if (!ok) continue;
        let dot = 0;
        for (let d = 0; d < q[i].length; d++) dot += q[i][d] * k[j][d];
        s[j] = dot * scale;
      }
      // 5. softmax over S, stable; a row with no allowed key stays zeros
      const max = Math.max(...s);
      if (max === -Infinity) {
        out.push(new Array(n).fill(0));
        continue;
      }
      const e = s.map((x) => (x === -Infinity ? 0 : Math.exp(Math.min(x - max, 0))));
      const sum = e.reduce((a, b) => a + b, 0);
      out.push(e.map((x) => x / sum));
    }
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

  function draw() {
    const prompt = data.prompts[parseInt(el("viz-prompt").value, 10)];
    const [layer, head] = el("viz-head").value.split(":").map((x) => parseInt(x, 10));
    const tau = tauOf(parseInt(el("viz-tau").value, 10));
    const causal = el("viz-causal").checked;
    const n = prompt.tokens.length;
    const padding = Math.min(readInt(el("viz-padding"), 0), n);
    const window = el("viz-window").value === "" ? null : readInt(el("viz-window"), null);
    const w = weights(prompt, layer, head, tau, causal, padding, window);
    const h = w.map(entropy);

    const out = el("viz-tau-value");
    out.textContent = tau.toFixed(3);
    out.dataset.tau = String(tau);

    const table = el("viz-heatmap");
    table.dataset.prompt = String(data.prompts.indexOf(prompt));
    table.dataset.layer = String(layer);
    table.dataset.head = String(head);
    table.dataset.tau = String(tau);
    table.dataset.causal = String(causal);
    table.dataset.padding = String(padding);
    table.dataset.window = window === null ? "" : String(window);
    const rows = [];
    const keys = prompt.tokens
      .map((t, j) => `<th class="key${j >= n - padding ? " padded" : ""}" title="key ${j}">${t}</th>`)
      .join("");
    rows.push(`<tr><th class="corner" title="query (rows) by key (columns)">q\\k</th>${keys}<th class="entropy">entropy</th></tr>`);
    const T = prompt.half;
    for (let i = 0; i < n; i++) {
      const target = T && layer === data.layers - 1 && i >= T && i <= 2 * T - 2 ? i - T + 1 : -1;
      const cells = w[i]
        .map((x, j) => {
          const cls = j === target ? ' class="target"' : "";
          return `<td${cls} data-w="${x}" style="background:${colour(x)}" title="query ${i} (token ${prompt.tokens[i]}) -> key ${j} (token ${prompt.tokens[j]}): ${x.toFixed(6)}"></td>`;
        })
        .join("");
      rows.push(
        `<tr class="row"><th class="query" title="query ${i}">${prompt.tokens[i]}</th>${cells}` +
          `<td class="entropy" data-h="${h[i]}">${h[i].toFixed(3)}</td></tr>`
      );
    }
    table.innerHTML = rows.join("");
    const rowMax = w.map((r) => Math.max(...r));
    const meanMax = rowMax.reduce((a, b) => a + b, 0) / n;
    const meanH = h.reduce((a, b) => a + b, 0) / n;
    el("viz-summary").textContent =
      `layer ${layer + 1}, head ${head}, tau = ${tau.toFixed(3)}: mean of the rows' largest ` +
      `weight ${meanMax.toFixed(3)}, mean entropy ${meanH.toFixed(3)} nats (uniform over ${n} keys: ` +
      `${Math.log(n).toFixed(3)})`;
  }

  for (const id of ["viz-prompt", "viz-head", "viz-tau", "viz-causal", "viz-padding", "viz-window"]) {
    el(id).addEventListener("input", draw);
    el(id).addEventListener("change", draw);
  }
  draw();
})();
