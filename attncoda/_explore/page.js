"use strict";
// attncoda's attention explorer. Loads nothing: the data is the JSON block #acx-data (a base64
// deflate stream of the rows), inflated with the browser's DecompressionStream. Every token
// and name reaches the page through textContent or canvas text, never as markup.
(function () {
  const $ = (id) => document.getElementById(id);
  const violations = [];
  window.acxViolations = violations;
  document.addEventListener("securitypolicyviolation", (e) => {
    violations.push(e.violatedDirective + " " + e.blockedURI);
  });
  const meta = JSON.parse($("acx-data").textContent);
  const L = meta.layers.length, H = meta.heads.length, S = meta.samples.length;
  const Q = meta.queries.length, K = meta.keys.length, N = meta.levels;
  const R = S * L * H * Q;
  const VIRIDIS = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
    [39, 173, 129], [94, 201, 98], [173, 220, 48], [253, 231, 37]];
  const ORANGES = [[255, 245, 235], [253, 174, 107], [217, 72, 1], [127, 39, 4]];
  function lut(stops) {
    const out = [];
    for (let i = 0; i < 256; i++) {
      const x = (i / 255) * (stops.length - 1), j = Math.min(Math.floor(x), stops.length - 2);
      const f = x - j, a = stops[j], b = stops[j + 1];
      out.push([0, 1, 2].map((c) => Math.round(a[c] + f * (b[c] - a[c]))));
    }
    return out;
  }
  const VIR = lut(VIRIDIS), ORA = lut(ORANGES);
  const css = (rgb) => "rgb(" + rgb[0] + "," + rgb[1] + "," + rgb[2] + ")";
  const VIRC = VIR.map(css), ORAC = ORA.map(css);
  // each sample's real keys and queries [first, last + 1): padding is never shown
  const realK = (s) => (meta.real ? meta.real[s] : [0, K]);
  const realQ = (s) => (meta.real_queries ? meta.real_queries[s] : [0, Q]);
  const nReal = (s) => Math.max(1, realK(s)[1] - realK(s)[0]);
  const tone = (t) => Math.max(0, Math.min(255, Math.round(t * 255)));

  let lam, ent, cent, lo, hi, chi, clo, off;
  const state = {
    sample: 0, conv: "split", win: Math.min(K, 64), start: 0, zoom: 0, compare: false,
    active: 0, ocolour: "sink", hover: null, lock: null,
    panels: [{ layer: meta.start.layer, head: meta.start.head },
      { layer: meta.start.layer, head: Math.min(meta.start.head + 1, H - 1) }],
  };

  // ---- the rows ------------------------------------------------------------------------
  const row = (s, l, h, q) => ((s * L + l) * H + h) * Q + q;
  const share = (r) => { const x = lam[r]; return x === Infinity ? 1 : x === -Infinity ? 0 : 1 / (1 + Math.exp(-x)); };
  const rest = (r) => { const x = lam[r]; return x === Infinity ? 0 : x === -Infinity ? 1 : 1 / (1 + Math.exp(x)); };
  const sinkSeen = (r) => !Number.isNaN(lam[r]) && lam[r] !== -Infinity;
  function code(r, k) {
    if (k < lo[r] || k >= hi[r]) return 0;
    const i = off[r] + k - lo[r];
    return (chi[i] << 8) | clo[i];
  }
  // {p, c (content weight, null for the sink), seen} of row r at key index k
  function cell(r, k, sink) {
    if (k === sink) return { seen: sinkSeen(r), p: share(r), c: null };
    const v = code(r, k);
    if (v === 0) return { seen: false, p: 0, c: 0 };
    const c = (v - 1) / N;
    return { seen: true, p: rest(r) * c, c: c };
  }

  function bytes(b64) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(b64);
    const bin = atob(b64), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  async function decode() {
    const stream = new Blob([bytes(meta.blob)]).stream().pipeThrough(new DecompressionStream("deflate"));
    const buf = new Uint8Array(await new Response(stream).arrayBuffer());
    let o = 0;
    const take = (n, T) => { const a = new T(buf.buffer.slice(o, o + n * T.BYTES_PER_ELEMENT)); o += n * T.BYTES_PER_ELEMENT; return a; };
    lam = take(R, Float32Array); ent = take(R, Float32Array); cent = take(R, Float32Array);
    lo = take(R, Uint16Array); hi = take(R, Uint16Array);
    const C = meta.n_codes;
    chi = buf.subarray(o, o + C); clo = buf.subarray(o + C, o + 2 * C);
    off = new Float64Array(R + 1);
    for (let r = 0; r < R; r++) off[r + 1] = off[r] + hi[r] - lo[r];
    if (off[R] !== C) throw new Error("the data block is inconsistent (" + off[R] + " != " + C + ")");
  }

  // ---- text helpers: textContent only ----------------------------------------------------
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function show(tok, width) {
    let t = tok.replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/\r/g, "");
    if (!t.trim()) t = t.replace(/ /g, "␣") || "∅";
    return width && t.length > width ? t.slice(0, width - 1) + "…" : t;
  }
  const tok = (k) => meta.tokens[state.sample][k];
  // a query's own token: in cross attention the target's, not the key (source) of that position
  const qtok = (q) => meta.query_tokens[state.sample][q];
  const f4 = (x) => (x === null || x === undefined || Number.isNaN(x) ? "–" : x.toFixed(4));
  const f3 = (x) => (x === null || x === undefined || Number.isNaN(x) ? "–" : x.toFixed(3));
  function fillSelect(sel, items) {
    sel.replaceChildren();
    items.forEach((text, i) => { const o = el("option", text); o.value = String(i); sel.appendChild(o); });
  }

  // ---- overview --------------------------------------------------------------------------
  const thumbs = [];
  function buildGrid() {
    const grid = $("acx-grid");
    grid.style.gridTemplateColumns = "auto repeat(" + H + ", 48px)";
    grid.appendChild(el("span", "", "acx-lab"));
    meta.heads.forEach((h) => grid.appendChild(el("span", "H" + h, "acx-lab")));
    for (let l = 0; l < L; l++) {
      grid.appendChild(el("span", "L" + meta.layers[l], "acx-lab"));
      for (let h = 0; h < H; h++) {
        const c = document.createElement("canvas");
        c.dataset.layer = String(l); c.dataset.head = String(h);
        c.setAttribute("role", "gridcell");
        c.addEventListener("click", () => pick(state.active, l, h));
        grid.appendChild(c);
        thumbs.push(c);
      }
    }
  }
  let drawn = "";
  function markGrid() {
    for (const c of thumbs) {
      const l = +c.dataset.layer, h = +c.dataset.head;
      c.className = [0, 1].filter((i) => (i === 0 || state.compare) && state.panels[i].layer === l &&
        state.panels[i].head === h).map((i) => "acx-sel" + i).join(" ");
    }
  }
  function drawGrid() {
    const s = state.sample, sink = meta.sink[s], [ka, kb] = realK(s), [qa, qb] = realQ(s);
    const nb = Math.min(nReal(s), 48), nq = Math.max(1, qb - qa), nbq = Math.min(nq, 48);
    const content = state.ocolour === "content";
    markGrid();
    if (drawn === s + ":" + content) return; // the thumbnails only change with the sample and colour
    drawn = s + ":" + content;
    const kbin = new Int32Array(K).fill(-1); // padding keys fall in no bin
    for (let k = ka; k < kb; k++) kbin[k] = Math.floor(((k - ka) * nb) / (kb - ka));
    for (const c of thumbs) {
      const l = +c.dataset.layer, h = +c.dataset.head;
      c.width = nb; c.height = nbq;
      const g = c.getContext("2d"), img = g.createImageData(nb, nbq), bins = new Float32Array(nb * nbq).fill(-1);
      // the largest weight of each bin of rows x keys (typed arrays only: 270 heads x T² cells)
      for (let q = qa; q < qb; q++) {
        const r = row(s, l, h, q), base = Math.floor(((q - qa) * nbq) / nq) * nb, scale = content ? 1 / N : rest(r) / N;
        const a = lo[r], o = off[r] - a;
        for (let k = a; k < hi[r]; k++) {
          const v = (chi[o + k] << 8) | clo[o + k];
          if (v === 0 || kbin[k] < 0) continue;
          const x = (v - 1) * scale, b = base + kbin[k];
          if (x > bins[b]) bins[b] = x;
        }
        if (!content && sinkSeen(r) && kbin[sink] >= 0) { const b = base + kbin[sink], x = share(r); if (x > bins[b]) bins[b] = x; }
      }
      let top = 0;
      for (const x of bins) if (x > top) top = x;
      for (let b = 0; b < bins.length; b++) {
        const o = 4 * b;
        if (bins[b] < 0) { img.data[o + 3] = 0; continue; }
        const rgb = (content ? VIR : ORA)[tone(top > 0 ? bins[b] / top : 0)];
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
      g.putImageData(img, 0, 0);
      const sm = meta.summaries[s][l][h];
      c.title = "layer " + meta.layers[l] + ", head " + meta.heads[h] + ": mean sink share " + f3(sm[0]) +
        ", content entropy " + f3(sm[4]) + " nats";
    }
    $("acx-olegend").textContent = content
      ? "each thumbnail: the content weights c/(1−s) of every row (viridis, to its own maximum)"
      : "each thumbnail: the raw weights p of every row (oranges, to its own maximum); a dark left column is a sink";
  }

  // ---- the large view ----------------------------------------------------------------------
  const panels = [$("acx-pa"), $("acx-pb")];
  const geo = [null, null];
  // where a view draws its cells, in positions (for tests and for scripts reading the page)
  window.acxGeometry = (i) => geo[i] && {
    rows: geo[i].rows.map((q) => meta.queries[q]), cols: geo[i].cols.map((c) => ({ k: meta.keys[c.k], x: c.x })),
    cs: geo[i].cs, top: geo[i].top, width: geo[i].width, height: geo[i].height,
  };
  const win = () => Math.min(state.win, nReal(state.sample));
  function windowRows() {
    const [ka, kb] = realK(state.sample), [qa, qb] = realQ(state.sample);
    const a = Math.max(ka, Math.min(state.start, kb - win())), b = Math.min(kb, a + win());
    const lo_ = meta.keys[a], hi_ = meta.keys[b - 1];
    const rows = [];
    // cross attention: every real query (the target's tokens) against the window of source keys
    for (let q = qa; q < qb; q++) if (meta.cross || (meta.queries[q] >= lo_ && meta.queries[q] <= hi_)) rows.push(q);
    return { a: a, b: b, rows: rows };
  }
  function layout(width) {
    const w = windowRows(), sink = meta.sink[state.sample], cols = [];
    for (let k = w.a; k < w.b; k++) if (!(state.conv !== "kept" && k === sink)) cols.push(k);
    const n = cols.length + (state.conv === "split" ? 1 : 0);
    const auto = Math.max(2, Math.min(22, Math.floor((width - 120) / Math.max(n + 1, 1))));
    const cs = state.zoom ? state.zoom : auto;
    const labels = cs >= 9;
    const left = labels ? 110 : 44, top = labels ? 84 : 30;
    const xs = [];
    let x = left;
    if (state.conv === "split") { xs.push({ k: sink, x: x }); x += cs + Math.max(6, cs); }
    for (const k of cols) { xs.push({ k: k, x: x }); x += cs; }
    return { cs: cs, labels: labels, left: left, top: top, cols: xs, rows: w.rows, width: x + 12, height: top + w.rows.length * cs + 12, sink: sink, split: state.conv === "split" };
  }
  function drawPanel(i) {
    const pane = panels[i], st = state.panels[i];
    const cells = pane.querySelector(".acx-cells"), over = pane.querySelector(".acx-over");
    // the views are stacked (compare puts the second under the first): each has the main column's width
    const main = $("acx-main"), avail = Math.max(360, (main.clientWidth || window.innerWidth) - 24);
    const g = layout(Math.min(avail, 1400));
    geo[i] = g;
    for (const c of [cells, over]) { c.width = g.width; c.height = g.height; }
    const ctx = cells.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, g.width, g.height);
    const s = state.sample;
    // the colour scale: kept shows p on [0, 1]; dropped and split show c/(1-s) to the 99th percentile
    let vmax = 1;
    if (state.conv !== "kept") {
      const vals = [];
      for (const q of g.rows) { const r = row(s, st.layer, st.head, q); for (const col of g.cols) { if (col.k === g.sink) continue; const v = cell(r, col.k, g.sink); if (v.seen) vals.push(v.c); } }
      vals.sort((a, b) => a - b);
      vmax = vals.length ? Math.max(vals[Math.min(vals.length - 1, Math.floor(0.99 * (vals.length - 1)))], 1e-9) : 1;
    }
    g.vmax = vmax;
    g.rows.forEach((q, y) => {
      const r = row(s, st.layer, st.head, q), py = g.top + y * g.cs;
      for (const col of g.cols) {
        const v = cell(r, col.k, g.sink);
        if (!v.seen) continue;
        if (state.conv === "kept") ctx.fillStyle = VIRC[tone(v.p)];
        else if (v.c === null) ctx.fillStyle = ORAC[tone(v.p)];
        else ctx.fillStyle = VIRC[tone(v.c / vmax)];
        ctx.fillRect(col.x, py, g.cs, g.cs);
      }
    });
    ctx.fillStyle = "#222";
    ctx.textBaseline = "middle";
    const font = Math.min(11, g.cs - 1);
    if (g.labels) {
      ctx.font = font + "px ui-monospace, Menlo, Consolas, monospace";
      ctx.textAlign = "right";
      g.rows.forEach((q, y) => ctx.fillText(show(qtok(q), 14), g.left - 4, g.top + y * g.cs + g.cs / 2));
      ctx.textAlign = "left";
      for (const col of g.cols) {
        ctx.save(); ctx.translate(col.x + g.cs / 2, g.top - 4); ctx.rotate(-Math.PI / 3);
        ctx.fillText(show(tok(col.k), 12), 0, 0); ctx.restore();
      }
    } else {
      ctx.font = "10px system-ui, sans-serif";
      const every = Math.max(1, Math.ceil(24 / g.cs));
      ctx.textAlign = "right";
      g.rows.forEach((q, y) => { if (y % every === 0) ctx.fillText(String(meta.queries[q]), g.left - 4, g.top + y * g.cs + g.cs / 2); });
      ctx.textAlign = "center";
      g.cols.forEach((col, j) => { if (j % every === 0 || col.k === g.sink) ctx.fillText(String(meta.keys[col.k]), col.x + g.cs / 2, g.top - 10); });
    }
    drawSummary(i);
    drawOverlay(i);
  }
  function drawOverlay(i) {
    const g = geo[i];
    if (!g) return;
    const over = panels[i].querySelector(".acx-over"), ctx = over.getContext("2d");
    ctx.clearRect(0, 0, over.width, over.height);
    const hv = state.hover;
    panels[i].dataset.hoverQuery = hv ? String(meta.queries[hv.q]) : "";
    panels[i].dataset.hoverKey = hv ? String(meta.keys[hv.k]) : "";
    if (!hv) return;
    const y = g.rows.indexOf(hv.q), col = g.cols.find((c) => c.k === hv.k);
    ctx.fillStyle = "rgba(214,39,40,0.22)";
    if (y >= 0) ctx.fillRect(0, g.top + y * g.cs, g.width, g.cs);
    if (col) ctx.fillRect(col.x, 0, g.cs, g.height);
    if (y >= 0 && col) {
      ctx.strokeStyle = "#d62728"; ctx.lineWidth = 2;
      ctx.strokeRect(col.x - 1, g.top + y * g.cs - 1, g.cs + 2, g.cs + 2);
    }
  }
  function drawSummary(i) {
    const st = state.panels[i], tbl = panels[i].querySelector("table.acx-summ");
    const one = meta.summaries[state.sample][st.layer][st.head];
    const all = [0, 1, 2, 3, 4].map((j) => {
      let t = 0, n = 0;
      for (let s = 0; s < S; s++) { const v = meta.summaries[s][st.layer][st.head]; if (v[j] !== null) { t += v[j] * v[5]; n += v[5]; } }
      return n ? t / n : null;
    });
    tbl.querySelector("caption").textContent = "layer " + meta.layers[st.layer] + ", head " + meta.heads[st.head] + ": means over rows (nats)";
    const body = tbl.querySelector("tbody");
    body.replaceChildren();
    const names = ["sink share s", "H", "= H_b(s)", "+ (1 − s) H(c)", "H(c)", "rows"];
    const head = el("tr"); head.appendChild(el("th", ""));
    names.forEach((name) => head.appendChild(el("th", name)));
    body.appendChild(head);
    const line = (label, vals) => {
      const tr = el("tr"); tr.appendChild(el("th", label));
      vals.forEach((v, j) => tr.appendChild(el("td", j === 5 ? String(v) : f3(v))));
      body.appendChild(tr);
    };
    line("this sample", one);
    if (S > 1) {
      let n = 0; for (let s = 0; s < S; s++) n += meta.summaries[s][st.layer][st.head][5];
      line("all " + S + " samples", [...all, n]);
    }
  }

  // ---- hover and tooltip ----------------------------------------------------------------------
  const tip = $("acx-tip");
  function hit(i, ev) {
    const g = geo[i], box = panels[i].querySelector(".acx-over").getBoundingClientRect();
    const x = ev.clientX - box.left, y = ev.clientY - box.top;
    const yi = Math.floor((y - g.top) / g.cs);
    const col = g.cols.find((c) => x >= c.x && x < c.x + g.cs);
    if (yi < 0 || yi >= g.rows.length || !col) return null;
    return { q: g.rows[yi], k: col.k };
  }
  function setHover(i, h, ev) {
    state.hover = h;
    drawOverlay(0); if (state.compare) drawOverlay(1);
    if (!h) { tip.hidden = true; tip.replaceChildren(); return; }
    const st = state.panels[i], s = state.sample, r = row(s, st.layer, st.head, h.q), sink = meta.sink[s];
    const v = cell(r, h.k, sink);
    tip.replaceChildren();
    const line = (parts) => { const d = el("div"); parts.forEach(([t, c]) => d.appendChild(el("span", t, c))); tip.appendChild(d); };
    line([["query " + meta.queries[h.q] + " "], [JSON.stringify(qtok(h.q)), "acx-tok"], [" → key " + meta.keys[h.k] + " "], [JSON.stringify(tok(h.k)), "acx-tok"], [h.k === sink ? " (the sink)" : ""]]);
    line([["layer " + meta.layers[st.layer] + ", head " + meta.heads[st.head] + ", sample " + meta.samples[s]]]);
    if (!v.seen) line([["this key is not visible to this query"]]);
    else {
      line([["p = " + f4(v.p)]]);
      line([["row sink share s = " + f4(share(r))]]);
      line([[v.c === null ? "c/(1 − s): – (the sink key)" : "c/(1 − s) = " + f4(v.c)]]);
    }
    const sr = share(r), e = ent[r], ce = cent[r];
    if (!Number.isNaN(e)) line([["row: H = " + f3(e) + " = H_b(s) " + f3(e - (1 - sr) * ce) + " + (1 − s) H(c) " + f3((1 - sr) * ce) + "; H(c) = " + f3(ce) + " nats"]]);
    tip.dataset.query = String(meta.queries[h.q]); tip.dataset.key = String(meta.keys[h.k]);
    tip.dataset.p = String(v.seen ? v.p : ""); tip.dataset.s = String(share(r)); tip.dataset.c = String(v.c === null ? "" : v.c);
    tip.hidden = false;
    place(ev.clientX, ev.clientY);
  }
  // the tooltip goes beside the pointer where it covers no summary table and fits the window
  function place(x, y) {
    const pad = 14, w = tip.offsetWidth, hgt = tip.offsetHeight, W = window.innerWidth, Hh = window.innerHeight;
    const tables = Array.from(document.querySelectorAll("table.acx-summ")).filter((t) => t.offsetParent)
      .map((t) => t.getBoundingClientRect());
    const clash = (l, t) => tables.some((b) => l < b.right && l + w > b.left && t < b.bottom && t + hgt > b.top);
    const xs = [x + pad, x - w - pad], ys = [y + pad, y - hgt - pad, y + 3 * pad, y - hgt - 3 * pad];
    let best = null;
    for (const t of ys) for (const l of xs) {
      const fits = l >= 0 && l + w <= W && t >= 0 && t + hgt <= Hh;
      if (fits && !clash(l, t)) { best = [l, t]; break; }
      if (!best && fits) best = [l, t, true];
    }
    if (best && best[2]) { // every spot next to the pointer covers a table: go below the lowest one it covers
      const under = tables.filter((b) => b.bottom + hgt <= Hh).map((b) => b.bottom + 4);
      const t = under.find((u) => !clash(best[0], u));
      if (t !== undefined) best = [best[0], t];
    }
    const [l, t] = best || [Math.max(0, W - w - 4), Math.max(0, Hh - hgt - 4)];
    tip.style.left = l + "px"; tip.style.top = t + "px";
  }
  panels.forEach((pane, i) => {
    const over = pane.querySelector(".acx-over");
    over.addEventListener("mousemove", (ev) => { if (!state.lock) setHover(i, hit(i, ev), ev); });
    over.addEventListener("mouseleave", () => { if (!state.lock) setHover(i, null); });
    // a click locks the cell (its row's tokens show below); a click on it again, or Escape, frees it
    over.addEventListener("click", (ev) => {
      const h = hit(i, ev);
      const same = h && state.lock && state.lock.i === i && state.lock.q === h.q && state.lock.k === h.k;
      state.lock = h && !same ? { i: i, q: h.q, k: h.k } : null;
      setHover(i, h, ev);
      drawTokens();
    });
    pane.addEventListener("mousedown", () => activate(i));
    const ls = pane.querySelector(".acx-layer"), hs = pane.querySelector(".acx-head");
    fillSelect(ls, meta.layers.map((l) => "L" + l));
    fillSelect(hs, meta.heads.map((h) => "H" + h));
    ls.addEventListener("change", () => pick(i, +ls.value, state.panels[i].head));
    hs.addEventListener("change", () => pick(i, state.panels[i].layer, +hs.value));
  });

  // ---- one head across samples: each sample's mean sink share and content entropy ----------
  function drawAcross() {
    const box = $("acx-samples");
    $("acx-across").hidden = S < 2;
    if (S < 2) return;
    const st = state.panels[state.active];
    let hmax = 0;
    for (let s = 0; s < S; s++) { const v = meta.summaries[s][st.layer][st.head][4]; if (v !== null && v > hmax) hmax = v; }
    box.replaceChildren();
    for (let s = 0; s < S; s++) {
      const v = meta.summaries[s][st.layer][st.head], b = el("button", "sample " + meta.samples[s] + (s === state.sample ? " (shown)" : ""));
      b.type = "button"; b.dataset.sample = String(meta.samples[s]);
      b.dataset.s = v[0] === null ? "" : String(v[0]); b.dataset.hc = v[4] === null ? "" : String(v[4]);
      if (s === state.sample) b.classList.add("acx-cur");
      b.addEventListener("click", () => setSample(s));
      const bar = (x, top, cls) => { const o = el("div", "", ""), i = el("div", "", cls); o.appendChild(i); i.style.width = (x === null || !top ? 0 : Math.round(120 * Math.min(1, x / top))) + "px"; return o; };
      box.appendChild(b);
      box.appendChild(bar(v[0], 1, "acx-bar1")); box.appendChild(el("span", "s " + f3(v[0])));
      box.appendChild(bar(v[4], hmax, "acx-bar2")); box.appendChild(el("span", "H(c) " + f3(v[4]) + " nats"));
    }
  }

  // ---- the token view: the sample's text coloured by what the locked query pays each token ----
  // under the convention: kept p; dropped c/(1 − s) (the sink has none); split s on the sink, c/(1 − s) elsewhere
  function weightOf(r, k, sink) {
    const v = cell(r, k, sink);
    if (!v.seen) return null;
    if (state.conv === "kept") return v.p;
    if (k === sink) return state.conv === "split" ? v.p : null;
    return v.c;
  }
  function drawTokens() {
    const box = $("acx-tokens"), cap = $("acx-tokcap");
    box.replaceChildren();
    const lk = state.lock;
    box.dataset.query = lk ? String(meta.queries[lk.q]) : "";
    if (!lk) { cap.textContent = "Click a cell to lock its query: the sample's tokens then show coloured by the attention it pays each one (click again or Esc to free it)."; return; }
    const st = state.panels[lk.i], s = state.sample, sink = meta.sink[s], r = row(s, st.layer, st.head, lk.q);
    const [ka, kb] = realK(s), ws = [];
    for (let k = ka; k < kb; k++) ws.push(weightOf(r, k, sink));
    let top = 0;
    ws.forEach((w, j) => { if (w !== null && !(state.conv === "split" && ka + j === sink) && w > top) top = w; });
    const what = { kept: "p (the raw row)", dropped: "c/(1 − s) (the sink removed)", split: "s on the sink (oranges), c/(1 − s) on the content (viridis)" }[state.conv];
    cap.textContent = "layer " + meta.layers[st.layer] + ", head " + meta.heads[st.head] + ": query " + meta.queries[lk.q] + " " + JSON.stringify(qtok(lk.q)) + " pays each token " + what + "; colours to the row's largest (" + f4(top) + ").";
    ws.forEach((w, j) => {
      const k = ka + j, span = el("span", show(tok(k)), "acx-t");
      span.dataset.k = String(meta.keys[k]);
      span.dataset.w = w === null ? "" : String(w);
      span.title = "key " + meta.keys[k] + " " + JSON.stringify(tok(k)) + (k === sink ? " (the sink)" : "") + ": " + (w === null ? (cell(r, k, sink).seen ? "– (the sink)" : "not visible") : f4(w));
      if (w !== null) {
        const sinkCol = state.conv === "split" && k === sink, t = sinkCol ? w : top > 0 ? w / top : 0;
        const rgb = (sinkCol ? ORA : VIR)[tone(t)];
        span.style.backgroundColor = css(rgb);
        span.style.color = (sinkCol ? t > 0.55 : t < 0.6) ? "#fff" : "#000";
      } else span.classList.add("acx-none");
      if (k === lk.k) span.classList.add("acx-at");
      box.appendChild(span);
    });
  }

  // ---- controls ----------------------------------------------------------------------------
  const CONV = {
    kept: "kept: the raw row p over every key in the window, the sink where it is (one scale, 0 to 1): a sink-heavy head shows little else.",
    dropped: "dropped: the sink removed and each row's content renormalised, c/(1 − s) (scale to the 99th percentile of the cells drawn).",
    split: "split: the sink share s apart on the left (oranges, 0 to 1) beside the renormalised content c/(1 − s) (viridis, to the 99th percentile).",
  };
  function activate(i) {
    if (i === 1 && !state.compare) return;
    state.active = i;
    panels.forEach((p, j) => p.classList.toggle("acx-active", j === i));
    drawGrid();
    drawAcross();
  }
  function pick(i, l, h) {
    state.panels[i] = { layer: Math.max(0, Math.min(L - 1, l)), head: Math.max(0, Math.min(H - 1, h)) };
    redraw();
  }
  function setConv(c) {
    state.conv = c;
    document.querySelectorAll('input[name="acx-conv"]').forEach((x) => { x.checked = x.value === c; });
    redraw();
  }
  function setStart(a) {
    const [ka, kb] = realK(state.sample);
    state.start = Math.max(ka, Math.min(kb - win(), a));
    redraw();
  }
  function setSample(i) {
    state.sample = Math.max(0, Math.min(S - 1, i));
    state.lock = null;
    fillWins();
    state.start = realK(state.sample)[0];
    redraw();
  }
  // the window's sizes: up to the sample's real tokens
  function fillWins() {
    const n = nReal(state.sample), ws = $("acx-win");
    const wins = [16, 32, 64, 128, 256, 512, 1024].filter((w) => w < n).concat([n]);
    ws.replaceChildren();
    wins.forEach((w) => { const o = el("option", w === n ? "all " + n + " tokens" : w + " tokens"); o.value = String(w); ws.appendChild(o); });
  }
  // the selected thumbnails stay in sight: the overview scrolls to them (only the overview)
  function reveal() {
    const box = $("acx-overview"), b = box.getBoundingClientRect();
    for (const c of thumbs) {
      if (!c.classList.contains("acx-sel" + state.active)) continue;
      const r = c.getBoundingClientRect();
      if (r.top < b.top + 40) box.scrollTop -= b.top + 40 - r.top;
      else if (r.bottom > b.bottom - 4) box.scrollTop += r.bottom - b.bottom + 4;
      if (r.left < b.left) box.scrollLeft -= b.left - r.left;
      else if (r.right > b.right) box.scrollLeft += r.right - b.right;
    }
  }
  function setZoom(dir) {
    const g = geo[0], cur = state.zoom || (g ? g.cs : 8);
    state.zoom = Math.max(2, Math.min(30, cur + dir * Math.max(1, Math.round(cur / 4))));
    redraw();
  }
  function redraw() {
    document.body.dataset.layer = String(meta.layers[state.panels[0].layer]);
    document.body.dataset.head = String(meta.heads[state.panels[0].head]);
    document.body.dataset.conv = state.conv;
    document.body.dataset.sample = String(meta.samples[state.sample]);
    panels.forEach((p, i) => {
      p.querySelector(".acx-layer").value = String(state.panels[i].layer);
      p.querySelector(".acx-head").value = String(state.panels[i].head);
      p.dataset.layer = String(meta.layers[state.panels[i].layer]);
      p.dataset.head = String(meta.heads[state.panels[i].head]);
    });
    $("acx-sample").value = String(state.sample);
    $("acx-win").value = String(win());
    const start = $("acx-start"), [ka, kb] = realK(state.sample), pad = K - (kb - ka);
    start.min = String(ka); start.max = String(Math.max(ka, kb - win())); start.value = String(state.start);
    $("acx-startv").textContent = "positions " + meta.keys[state.start] + "–" + meta.keys[Math.min(kb, state.start + win()) - 1] + " of " + meta.keys[ka] + "–" + meta.keys[kb - 1] + (pad > 0 ? " (" + pad + " padding left out)" : "");
    $("acx-zoomv").textContent = state.zoom ? state.zoom + " px" : "fit";
    $("acx-convnote").textContent = CONV[state.conv];
    panels[1].hidden = !state.compare;
    $("acx-compare").checked = state.compare;
    state.hover = state.lock ? { q: state.lock.q, k: state.lock.k } : null; tip.hidden = true;
    if (state.lock && state.lock.i === 1 && !state.compare) state.lock = null;
    drawPanel(0);
    if (state.compare) drawPanel(1);
    drawGrid();
    reveal();
    drawTokens();
    drawAcross();
  }

  // a link may name the head to open: explorer.html#layer=L&head=H&sample=S (coordinate values)
  function fromHash() {
    const h = new URLSearchParams((window.location.hash || "").slice(1));
    const at = (key, values) => (h.has(key) ? values.indexOf(Number(h.get(key))) : -1);
    const l = at("layer", meta.layers), hd = at("head", meta.heads), s = at("sample", meta.samples);
    if (l >= 0) state.panels[0].layer = l;
    if (hd >= 0) state.panels[0].head = hd;
    if (s >= 0 && s !== state.sample) { state.sample = s; state.lock = null; fillWins(); state.start = realK(s)[0]; }
    if (l >= 0 || hd >= 0) state.active = 0;
  }
  function setup() {
    $("acx-title").textContent = meta.title;
    $("acx-sub").textContent = L + " layers × " + H + " heads, " + S + " sample" + (S > 1 ? "s" : "") + ", " + Q + " queries × " + K + " keys" + (meta.model ? "; model " + meta.model : "") + (meta.cross ? ". Cross attention: rows are the target's tokens, columns the source's" : "") + ". Summaries: " + meta.source + ".";
    $("acx-precision").textContent = "Precision: content weights c/(1 − s) are stored to the nearest 1/" + N + ", so the page shows them within " + (0.5 / N).toExponential(1) + " and p within (1 − s) × " + (0.5 / N).toExponential(1) + "; s is float32, the entropies are float32 to a relative 5e-4. Made by attncoda; loads nothing.";
    fillSelect($("acx-sample"), meta.samples.map((s, i) => "sample " + s + ": " + show((meta.cross ? meta.query_tokens[i].slice(0, 6) : meta.tokens[i].slice(meta.sink[i], meta.sink[i] + 6)).join(""), 40)));
    const ws = $("acx-win");
    state.win = 64;
    fillWins();
    state.start = realK(0)[0];
    fromHash();
    window.addEventListener("hashchange", () => { fromHash(); if (lam) redraw(); });
    $("acx-sample").addEventListener("change", (e) => setSample(+e.target.value));
    ws.addEventListener("change", () => { const n = nReal(state.sample); state.win = +ws.value >= n ? 1 << 30 : +ws.value; setStart(state.start); });
    $("acx-start").addEventListener("input", (e) => setStart(+e.target.value));
    $("acx-zin").addEventListener("click", () => setZoom(1));
    $("acx-zout").addEventListener("click", () => setZoom(-1));
    $("acx-compare").addEventListener("change", (e) => { state.compare = e.target.checked; if (!state.compare) activate(0); redraw(); });
    $("acx-ocolour").addEventListener("change", (e) => { state.ocolour = e.target.value; drawGrid(); });
    document.querySelectorAll('input[name="acx-conv"]').forEach((x) => x.addEventListener("change", () => setConv(x.value)));
    document.addEventListener("keydown", onKey);
    let width = window.innerWidth; // a fitted view follows the window's width, not its height
    window.addEventListener("resize", () => {
      if (!state.zoom && window.innerWidth !== width) { width = window.innerWidth; redraw(); }
    });
    buildGrid();
  }
  function onKey(ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const t = ev.target && ev.target.tagName;
    if ((t === "SELECT" || t === "INPUT") && ev.key.startsWith("Arrow")) return; // the control's own keys
    const p = state.panels[state.active], i = state.active;
    const win_ = win(), keys = {
      ArrowUp: () => pick(i, p.layer - 1, p.head), ArrowDown: () => pick(i, p.layer + 1, p.head),
      ArrowLeft: () => pick(i, p.layer, p.head - 1), ArrowRight: () => pick(i, p.layer, p.head + 1),
      n: () => setSample(state.sample + 1), p: () => setSample(state.sample - 1),
      k: () => setConv("kept"), d: () => setConv("dropped"), s: () => setConv("split"),
      "[": () => setStart(state.start - Math.max(1, win_ >> 1)), "]": () => setStart(state.start + Math.max(1, win_ >> 1)),
      Home: () => setStart(realK(state.sample)[0]), End: () => setStart(realK(state.sample)[1]),
      "+": () => setZoom(1), "=": () => setZoom(1), "-": () => setZoom(-1),
      c: () => { state.compare = !state.compare; if (!state.compare) activate(0); redraw(); },
      a: () => activate(0), b: () => activate(1),
      Escape: () => { state.lock = null; setHover(state.active, null); drawTokens(); },
      o: () => { state.ocolour = state.ocolour === "sink" ? "content" : "sink"; $("acx-ocolour").value = state.ocolour; drawGrid(); },
    };
    const f = keys[ev.key];
    if (f) { ev.preventDefault(); f(); }
  }

  setup();
  decode().then(() => {
    performance.mark("acx-decoded");
    redraw();
    $("acx-status").hidden = true;
    document.documentElement.dataset.ready = "1";
    requestAnimationFrame(() => performance.mark("acx-first-draw"));
  }).catch((err) => {
    $("acx-status").textContent = "The explorer could not decode its data: " + err;
    document.documentElement.dataset.ready = "error";
  });
})();
