// Megha dashboard: renders the snapshots the server pushes (server-sent events).
"use strict";

const COLOURS = ["#2e86c1", "#d35400", "#27ae60", "#8e44ad", "#c0392b", "#16a085",
  "#7f8c8d", "#b7950b"];

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function svg(tag, attrs, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms";
  return s.toFixed(s < 10 ? 2 : 1) + " s";
}

function num(x, digits) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits || 0);
}

function kv(label, value) {
  return h("span", { class: "kv" }, label + " ", h("b", {}, value), "  ");
}

function badge(text, kind) {
  return h("span", { class: "badge " + (kind || "") }, text);
}

function colourOf(snap) {
  const m = {};
  snap.gms.forEach((g, i) => { m[g.id] = COLOURS[i % COLOURS.length]; });
  return m;
}

function bitRow(label, bits, colourAt) {
  const cells = h("div", { class: "bits" });
  for (let i = 0; i < bits.length; i++) {
    const c = colourAt(i);
    cells.append(h("span", {
      class: "bit " + (bits[i] === "1" ? "on" : "off") + (c ? "" : " none"),
      style: c ? "color:" + c : "", title: label + " bit " + i + " = " + bits[i],
    }));
  }
  return h("div", { class: "vec" }, h("span", { class: "label" }, label), cells,
    h("span", { class: "kv" }, bits));
}

function renderGms(snap, colour) {
  const box = document.getElementById("gms");
  box.replaceChildren(...snap.gms.map((g) => {
    const state = !g.up ? "down" : g.ready ? "up" : "starting";
    return h("div", { class: "card gm" + (g.up ? "" : " down"), id: "gm-" + g.id },
      h("h3", {}, h("span", { style: "color:" + colour[g.id] }, "■"), g.id,
        badge(state, g.up ? (g.ready ? "" : "starting") : "down")),
      g.up ? h("div", {}, kv("queued", num(g.queued)), kv("in flight", num(g.inflight)),
        kv("running", num(g.running)))
        : h("div", { class: "kv" }, g.error));
  }));
}

function renderLms(snap, colour) {
  const box = document.getElementById("lms");
  box.replaceChildren(...snap.lms.map((lm) => {
    const homes = [];
    for (let i = 0; i < lm.nodes; i++) {
      for (const [gm, part] of Object.entries(lm.partitions)) if (part[i] === "1") homes[i] = gm;
    }
    const rows = Object.entries(lm.partitions).map(([gm, part]) =>
      bitRow(gm + " part.", part, (i) => (part[i] === "1" ? colour[gm] : null)));
    rows.push(bitRow("free", lm.avail, (i) => colour[homes[i]]));
    const procs = lm.processes.length > 1 ? h("div", { class: "kv" },
      ...lm.processes.map((p) => h("span", {}, p.name + ": ", badge(p.role, p.role), " "))) : null;
    return h("div", { class: "card lm" + (lm.up ? "" : " down") + (lm.stale ? " stale" : ""),
      id: "lm-" + lm.id },
    h("h3", {}, lm.id, badge(lm.up ? (lm.active ? "up" : "standby") : "down",
      lm.up ? (lm.active ? "" : "standby") : "down")),
    h("div", {}, kv("epoch", lm.epoch === null || lm.epoch === undefined ? "–" : lm.epoch),
      kv("nodes alive", num(lm.nodes_alive) + "/" + lm.nodes), kv("running", num(lm.running)),
      kv("logical nodes", num(lm.logical_nodes))),
    lm.up ? null : h("div", { class: "kv" },
      lm.processes.map((p) => p.name + ": " + p.error).join("; ") +
      (lm.stale && lm.epoch !== null && lm.epoch !== undefined ? " (last known bits)" : "")),
    procs, ...rows);
  }));
}

function renderUsers(snap) {
  const body = document.querySelector("#users tbody");
  body.replaceChildren(...snap.users.map((u) => {
    const used = u.dominant_share === null ? 0 : u.dominant_share;
    const bar = h("div", { class: "share", title: "dominant share " + num(used, 3) +
      " of configured " + num(u.share, 3) },
    h("div", { class: "used", style: "width:" + Math.min(100, used * 100) + "%" }),
    h("div", { class: "target", style: "left:" + Math.min(100, u.share * 100) + "%" }));
    return h("tr", { id: "user-" + u.user }, h("td", {}, u.user), h("td", {}, u.gm),
      h("td", { class: "num" }, u.queue === null || u.queue === undefined ? "–" : u.queue),
      h("td", {}, bar, h("span", { class: "kv" },
        (u.dominant_share === null ? "–" : num(used, 3)) + " / " + num(u.share, 3))));
  }));
}

function renderHistogram(a) {
  const est = (x) => (!a.tasks ? "–" : seconds(x));
  document.getElementById("mean").textContent = est(a.mean_s);
  document.getElementById("p50").textContent = est(a.p50_s);
  document.getElementById("p99").textContent = est(a.p99_s);
  document.getElementById("alloc-tasks").textContent = a.tasks;
  const el = document.getElementById("histogram");
  const W = 420, H = 170, top = 10, bottom = 30, left = 8;
  const n = a.counts.length, bw = (W - left * 2) / n;
  const max = Math.max(1, ...a.counts);
  const kids = [];
  a.counts.forEach((c, i) => {
    const hgt = (H - top - bottom) * c / max;
    const bar = svg("rect", { x: left + i * bw + 1, y: H - bottom - hgt, width: bw - 2,
      height: hgt });
    bar.append(svg("title", {}, c + " tasks"));
    kids.push(bar);
    if (c) kids.push(svg("text", { x: left + i * bw + bw / 2, y: H - bottom - hgt - 2,
      "text-anchor": "middle" }, String(c)));
    const edge = i < a.edges_s.length ? "<" + seconds(a.edges_s[i]).replace(" ", "") : "≥" +
      seconds(a.edges_s[a.edges_s.length - 1]).replace(" ", "");
    kids.push(svg("text", { x: left + i * bw + bw / 2, y: H - bottom + 12 + (i % 2) * 10,
      "text-anchor": "middle" }, edge));
  });
  el.replaceChildren(...kids);
}

const RATE_LABELS = {
  allocations: "tasks placed", tasks_finished: "tasks finished", preemptions: "preemptions",
  inconsistencies: "inconsistencies (internal + external)", repartitions: "repartitions",
  http_requests: "messages taken over HTTP", http_refused: "inputs refused (signature, epoch, body)",
};

function renderRates(snap) {
  const body = document.querySelector("#rates tbody");
  body.replaceChildren(...Object.entries(RATE_LABELS).map(([k, label]) =>
    h("tr", { id: "rate-" + k }, h("td", {}, label),
      h("td", { class: "num" }, num(snap.rates_per_min[k], 1)))));
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

function renderEvents(snap) {
  const list = document.getElementById("events");
  list.replaceChildren(...snap.events.map((e) =>
    h("li", {}, h("span", { class: "when" }, clock(e.at)), " ", h("b", {}, e.who), " ", e.what)));
}

function render(snap) {
  const colour = colourOf(snap);
  document.getElementById("federation").textContent = snap.federation;
  const c = snap.counts;
  document.getElementById("gm-count").textContent = c.gms_up + "/" + c.gms;
  document.getElementById("lm-count").textContent = c.lms_up + "/" + c.lms;
  const b = snap.broker.up;
  const broker = document.getElementById("broker");
  broker.textContent = b === null ? "–" : b ? "up" : "down";
  broker.className = b === false ? "down" : "";
  document.getElementById("updated").textContent = clock(snap.at);
  renderGms(snap, colour);
  renderLms(snap, colour);
  renderUsers(snap);
  renderHistogram(snap.allocation);
  renderRates(snap);
  renderEvents(snap);
}

function renderTask(answer) {
  const box = document.getElementById("task-result");
  if (!answer.available) {
    box.replaceChildren(h("p", { class: "unavailable" }, "not available"),
      h("pre", {}, typeof answer.detail === "string" ? answer.detail
        : JSON.stringify(answer.detail, null, 2)));
    return;
  }
  const t = answer.task;
  const parts = [h("p", {}, "from " + answer.gm)];
  const timeline = t.timeline || t.events;
  if (Array.isArray(timeline)) {
    parts.push(h("table", {}, ...timeline.map((row) => h("tr", {},
      ...(Array.isArray(row) ? row : Object.values(row)).map((x) => h("td", {},
        typeof x === "object" ? JSON.stringify(x) : x))))));
  }
  const why = t.why || t.wait_reason || t.waiting || t.waits;
  if (why !== undefined) parts.push(h("p", {}, h("b", {}, "why it waits: "),
    typeof why === "string" ? why : JSON.stringify(why)));
  parts.push(h("pre", {}, JSON.stringify(t, null, 2)));
  box.replaceChildren(...parts);
}

document.getElementById("task-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const user = document.getElementById("task-user").value.trim();
  const id = document.getElementById("task-id").value.trim();
  const box = document.getElementById("task-result");
  if (!user || !id) { box.textContent = "give a user and a task id"; return; }
  box.textContent = "asking…";
  try {
    const resp = await fetch("/api/task/" + encodeURIComponent(user) + "/" +
      encodeURIComponent(id));
    if (!resp.ok) { renderTask({ available: false, detail: await resp.text() }); return; }
    renderTask(await resp.json());
  } catch (e) {
    renderTask({ available: false, detail: "the dashboard did not answer: " + e });
  }
});

function connect() {
  const link = document.getElementById("link");
  const source = new EventSource("/events");
  source.onopen = () => { link.textContent = "live"; link.className = "stat"; };
  source.onmessage = (ev) => {
    window.meghaSnapshots = (window.meghaSnapshots || 0) + 1;  // counted by the tests
    render(JSON.parse(ev.data));
  };
  source.onerror = () => { link.textContent = "dashboard unreachable, retrying…";
    link.className = "stat lost"; };
}

connect();
