// TrainDeck monitor page: the run list and one run's live plots, fed by server-sent events
// (/api/stream). Text from the runs is set as textContent only, never as HTML.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const BASE = ["loss", "memory", "throughput", "lr", "gpu", "routing"];
  const S = {
    session: null,
    runs: [],
    run: null,
    source: null,
    data: null,
    plots: new Map(), // plot name -> {box, u, keys}
    drawPending: false,
    lastDraw: 0,
    gone: false,
  };

  // -- numbers -------------------------------------------------------------------------

  function duration(s) {
    if (s == null) return "—";
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
    return `${h}:${String(m).padStart(2, "0")}:${String(x).padStart(2, "0")}`;
  }
  function whole(v) {
    return v == null ? "—" : Math.round(v).toLocaleString("en-US");
  }
  function short(v) {
    if (v == null || !isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }
  function progressText(r) {
    if (!r.max_steps) return r.step ? `step ${whole(r.step)}` : "no steps yet";
    let t = `step ${whole(r.step)} of ${whole(r.max_steps)}`;
    if (r.state === "running" && r.eta_s != null) t += ` · ETA ${duration(r.eta_s)}`;
    return t;
  }

  // -- the records, by step ------------------------------------------------------------

  function newData() {
    return { x: [], index: new Map(), cols: new Map(), last: null, lastEval: {} };
  }
  function rowFor(d, step) {
    let i = d.index.get(step);
    if (i !== undefined) return i;
    const n = d.x.length;
    if (n === 0 || step > d.x[n - 1]) {
      i = n;
      d.x.push(step);
      for (const c of d.cols.values()) c.push(null);
    } else {
      // an evaluation between two logged steps: inserted in order
      i = d.x.findIndex((s) => s > step);
      d.x.splice(i, 0, step);
      for (const c of d.cols.values()) c.splice(i, 0, null);
      d.index.clear();
      d.x.forEach((s, j) => d.index.set(s, j));
    }
    d.index.set(step, i);
    return i;
  }
  function put(d, rec, isEval) {
    const i = rowFor(d, rec.step);
    for (const [k, v] of Object.entries(rec)) {
      if (k === "step" || v == null) continue;
      let c = d.cols.get(k);
      if (!c) {
        c = new Array(d.x.length).fill(null);
        d.cols.set(k, c);
      }
      c[i] = v;
      if (isEval) d.lastEval[k] = v;
    }
    if (!isEval && (!d.last || rec.step >= d.last.step)) d.last = rec;
  }
  function add(msg) {
    if (!S.data) S.data = newData();
    for (const r of msg.train || []) put(S.data, r, false);
    for (const r of msg.evals || []) put(S.data, r, true);
    scheduleDraw();
    showSelected();
  }

  // -- plots (uPlot) ----------------------------------------------------------------------

  // The window's grid: loss (a method's plot beside it), memory and throughput, learning
  // rate (the GPU beside it), a mixture's routing; a plot alone in its row takes the width.
  function rows() {
    const specs = S.session.plots;
    const by = (n) => specs.find((p) => p.name === n);
    const methodPlots = specs.filter((p) => !BASE.includes(p.name));
    return [[by("loss"), ...methodPlots], [by("memory"), by("throughput")], [by("lr"), by("gpu")], [by("routing")]].map(
      (row) => row.filter(Boolean)
    );
  }
  function plotHeight() {
    return window.innerWidth < 820 ? 190 : 230;
  }
  function scheduleDraw() {
    if (S.drawPending) return;
    S.drawPending = true;
    const wait = Math.max(0, 400 - (Date.now() - S.lastDraw));
    setTimeout(() => {
      S.drawPending = false;
      S.lastDraw = Date.now();
      draw();
    }, wait);
  }
  function clearPlots() {
    for (const p of S.plots.values()) {
      p.u.destroy();
      p.box.remove();
    }
    S.plots.clear();
  }
  function draw() {
    const d = S.data;
    if (!d || typeof uPlot === "undefined") return;
    const container = $("plots");
    const order = [];
    for (const row of rows()) {
      const shown = [];
      for (const spec of row) {
        const keys = spec.curves.filter((c) => d.cols.has(c.key)).map((c) => c.key);
        const plot = keys.length ? plotFor(spec, keys, d) : dropPlot(spec.name);
        if (plot) shown.push(plot);
      }
      shown.forEach((p) => p.box.classList.toggle("wide", shown.length === 1));
      order.push(...shown);
    }
    order.forEach((p, i) => {
      if (container.children[i] !== p.box) container.insertBefore(p.box, container.children[i] || null);
    });
    resize();
  }
  function plotFor(spec, keys, d) {
    const data = [d.x, ...keys.map((k) => d.cols.get(k))];
    let p = S.plots.get(spec.name);
    if (p && p.keys.join() === keys.join()) {
      p.u.setData(data);
    } else {
      dropPlot(spec.name);
      p = makePlot(spec, keys, data);
      S.plots.set(spec.name, p);
    }
    // the legend shows the latest values until the pointer picks a step (after uPlot's redraw)
    const u = p.u;
    requestAnimationFrame(() => u.cursor.left < 0 && u.setLegend({ idx: u.data[0].length - 1 }));
    return p;
  }
  function dropPlot(name) {
    const p = S.plots.get(name);
    if (p) {
      p.u.destroy();
      p.box.remove();
      S.plots.delete(name);
    }
    return null;
  }
  function makePlot(spec, keys, data) {
    const box = document.createElement("div");
    box.className = "plot";
    box.dataset.plot = spec.name;
    const title = document.createElement("h3");
    title.textContent = spec.title;
    box.appendChild(title);
    const curves = keys.map((k) => spec.curves.find((c) => c.key === k));
    const right = curves.some((c) => c.right);
    // a phone: slimmer axes without titles (the legend names the curves) leave them room
    const narrow = window.innerWidth < 820;
    const axis = { size: fitTicks, values: (u, vals) => vals.map(short) };
    const named = (text) => (narrow ? {} : { label: text });
    const opts = {
      width: 400,
      height: plotHeight(),
      scales: Object.assign({ x: { time: false } }, right ? { r: { auto: true } } : {}),
      axes: [
        Object.assign({ size: narrow ? 28 : 40 }, named("step")),
        Object.assign({}, axis, named(spec.unit)),
        ...(right ? [Object.assign({ scale: "r", side: 1, grid: { show: false } }, axis, named(spec.right))] : []),
      ],
      series: [
        { label: "step" },
        ...curves.map((c) => ({
          label: c.label,
          stroke: c.color,
          width: c.width,
          scale: c.right ? "r" : "y",
          spanGaps: true,
          value: (u, v) => short(v),
          points: { show: c.points, size: 5, fill: c.color },
        })),
      ],
      cursor: { drag: { x: true, y: false } },
    };
    // eslint-disable-next-line no-undef
    const u = new uPlot(opts, data, box);
    return { box, u, keys };
  }
  // An axis as wide as its longest tick label (uPlot's own recipe for dynamic sizes).
  function fitTicks(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    let size = axis.ticks.size + axis.gap;
    const longest = (values || []).reduce((a, v) => (v.length > a.length ? v : a), "");
    if (longest) {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / (window.devicePixelRatio || 1);
    }
    return Math.ceil(size) + 2;
  }
  function resize() {
    const narrow = window.innerWidth < 820;
    if (S.narrow !== undefined && S.narrow !== narrow) {
      S.narrow = narrow; // a phone turned, a window resized: axes made for the new width
      clearPlots();
      draw();
      return;
    }
    S.narrow = narrow;
    for (const p of S.plots.values()) {
      const width = Math.max(200, p.box.clientWidth - 14);
      if (p.u.width !== width || p.u.height !== plotHeight()) p.u.setSize({ width, height: plotHeight() });
    }
  }

  // -- a mixture of experts' load: a heat strip, layers x experts ---------------------------

  function drawExperts(m) {
    const box = $("experts-box");
    if (!m || !m.shares || !m.shares.length) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    $("experts-note").textContent = `step ${whole(m.step)} · ${m.note}`;
    const canvas = $("experts");
    const rows = m.shares.length;
    const cols = Math.max(...m.shares.map((r) => r.length));
    const width = canvas.clientWidth || 600;
    const height = Math.max(60, Math.min(260, rows * 16));
    const dpr = window.devicePixelRatio || 1;
    canvas.style.height = height + "px";
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.clearRect(0, 0, width, height);
    const left = 34, cw = (width - left) / cols, ch = height / rows;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    m.shares.forEach((row, i) => {
      ctx.fillStyle = "#555";
      ctx.fillText(`L${m.layers[i]}`, 2, i * ch + ch / 2);
      row.forEach((share, e) => {
        const x = left + e * cw, y = i * ch;
        const level = Math.min(1, (share * cols) / 2); // 0.5: an even share
        const shade = Math.round(255 - level * 200);
        ctx.fillStyle = `rgb(${shade},${Math.round(255 - level * 120)},255)`;
        ctx.fillRect(x, y, Math.max(1, cw - 1), Math.max(1, ch - 1));
        if (share === 0) {
          ctx.strokeStyle = "#c62828";
          ctx.beginPath();
          ctx.moveTo(x + 1, y + 1);
          ctx.lineTo(x + cw - 2, y + ch - 2);
          ctx.moveTo(x + cw - 2, y + 1);
          ctx.lineTo(x + 1, y + ch - 2);
          ctx.stroke();
        }
      });
    });
  }

  // -- the run list and the chosen run ----------------------------------------------------

  function showRuns(runs) {
    S.runs = runs;
    $("runs-empty").hidden = runs.length > 0;
    const list = $("runs");
    list.replaceChildren(
      ...runs.map((r) => {
        const li = document.createElement("li");
        const b = document.createElement("button");
        b.type = "button";
        b.className = "run-item";
        b.dataset.name = r.name;
        b.setAttribute("aria-current", String(r.name === S.run));
        const name = document.createElement("span");
        name.className = "name";
        name.textContent = r.name;
        const line = document.createElement("span");
        line.className = "line";
        const state = document.createElement("span");
        state.className = `state ${r.state}`;
        state.textContent = r.state;
        line.append(state, progressText(r));
        b.append(name, line);
        b.addEventListener("click", () => choose(r.name));
        li.appendChild(b);
        return li;
      })
    );
    if (!S.run && runs.length) {
      const wanted = decodeURIComponent((location.hash.match(/run=([^&]+)/) || [])[1] || "");
      const pick = runs.find((r) => r.name === wanted) || runs.find((r) => r.state === "running") || runs[0];
      choose(pick.name);
      return;
    }
    showSelected();
  }
  function choose(name) {
    if (name === S.run && S.source) return;
    S.run = name;
    S.data = newData();
    S.gone = false;
    clearPlots();
    drawExperts(null);
    $("samples").textContent = "No sample yet: one is written at each evaluation.";
    $("samples-step").textContent = "";
    $("log").textContent = "";
    $("completions-box").hidden = true;
    history.replaceState(null, "", "#run=" + encodeURIComponent(name));
    for (const b of document.querySelectorAll(".run-item")) b.setAttribute("aria-current", String(b.dataset.name === name));
    connect();
    showSelected();
  }
  function showSelected() {
    const r = S.runs.find((x) => x.name === S.run);
    $("run").hidden = !S.run;
    if (!S.run) return;
    $("run-name").textContent = S.run;
    $("run-gone").hidden = !(S.gone || (r && r.state === "missing"));
    const state = $("run-state");
    state.textContent = r ? r.state : "";
    state.className = `state ${r ? r.state : ""}`;
    const last = S.data && S.data.last;
    const step = last && r ? Object.assign({}, r, { step: Math.max(r.step || 0, last.step) }) : r;
    $("run-progress").textContent = step ? progressText(step) : "";
    const parts = [];
    if (last) {
      parts.push(`loss ${short(last.loss)}`);
      const ev = S.data.lastEval;
      if (ev.val_loss != null) parts.push(`val ${short(ev.val_loss)}`);
      if (ev.val_bpb != null) parts.push(`${short(ev.val_bpb)} bits/byte`);
      if (last.tokens_per_s != null) parts.push(`${whole(last.tokens_per_s)} tok/s`);
      if (last.elapsed_s != null) parts.push(`elapsed ${duration(last.elapsed_s)}`);
    }
    if (r && r.error) parts.push(`error: ${r.error}`);
    $("run-summary").textContent = parts.join(" · ");
    $("controls").hidden = !(S.session && S.session.control && r && r.state === "running");
  }

  // -- the stream --------------------------------------------------------------------------

  function setConn(kind, text) {
    const c = $("conn");
    c.className = `conn ${kind}`;
    c.textContent = text;
  }
  function connect() {
    if (S.source) S.source.close();
    const url = "/api/stream" + (S.run ? "?run=" + encodeURIComponent(S.run) : "");
    const es = new EventSource(url);
    S.source = es;
    const on = (name, f) => es.addEventListener(name, (e) => f(JSON.parse(e.data)));
    es.onopen = () => setConn("live", "live");
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) {
        setConn("lost", "disconnected: the monitor stopped or restarted (open its new link)");
      } else {
        setConn("lost", "reconnecting…");
      }
    };
    on("runs", showRuns);
    on("reset", (m) => {
      S.data = newData();
      S.gone = false;
      clearPlots();
      add(m);
    });
    on("records", add);
    on("experts", drawExperts);
    on("gone", () => {
      S.gone = true;
      showSelected();
    });
    on("samples", (m) => {
      if (!m.text) return;
      $("samples").textContent = m.text;
      $("samples-step").textContent = m.step != null ? `step ${whole(m.step)}` : "";
    });
    on("log", showLog);
    on("completions", showCompletions);
  }
  function showLog(m) {
    const log = $("log");
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = (m.lines || []).join("\n");
    if (atEnd) log.scrollTop = log.scrollHeight;
  }
  function showCompletions(m) {
    const box = $("completions-box");
    if (!m.rows || !m.rows.length) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    $("completions-step").textContent = `step ${whole(m.step)} · ${m.rows.length} of ${m.total}`;
    const body = $("completions").tBodies[0];
    body.replaceChildren(
      ...m.rows.map((row) => {
        const tr = document.createElement("tr");
        for (const v of [row.prompt, row.completion, short(row.reward), short(row.advantage)]) {
          const td = document.createElement("td");
          td.textContent = v;
          tr.appendChild(td);
        }
        return tr;
      })
    );
  }

  // -- control actions (--control) -----------------------------------------------------

  const ASK = {
    stop: "Stop this run? It saves a checkpoint and stops; Resume continues it.",
    finish: "Finish this run? The learning rate cools down over a short cooldown, then it saves and stops.",
  };
  const DONE = {
    stop: "Stop requested: the run saves a checkpoint and stops.",
    save: "Save requested: a checkpoint is written after this step.",
    finish: "Finish requested: a short cooldown, then a checkpoint and the end.",
  };
  async function act(action) {
    const run = S.run;
    if (ASK[action] && !window.confirm(`${run}: ${ASK[action]}`)) return;
    const msg = $("control-msg");
    msg.textContent = "sending…";
    try {
      const r = await fetch(`/api/runs/${encodeURIComponent(run)}/${action}`, {
        method: "POST",
        headers: { "X-TrainDeck-CSRF": S.session.csrf },
        credentials: "same-origin",
      });
      msg.textContent = r.ok ? DONE[action] : (await r.text()).trim();
    } catch (e) {
      msg.textContent = `not sent: ${e}`;
    }
  }

  // -- start ---------------------------------------------------------------------------

  async function start() {
    if (location.search.includes("token=")) history.replaceState(null, "", "/" + location.hash);
    const r = await fetch("/api/session", { credentials: "same-origin" });
    if (!r.ok) {
      setConn("lost", "no access: open the full link TrainDeck printed");
      return;
    }
    S.session = await r.json();
    $("watching").textContent = `watching ${S.session.watching}${S.session.control ? " · control on" : ""}`;
    for (const b of document.querySelectorAll("#controls button")) b.addEventListener("click", () => act(b.dataset.action));
    new ResizeObserver(() => resize()).observe($("plots"));
    connect();
  }
  start();
})();
