// gspo-rl dashboard: polls GET v1/dashboard/state every 2 s and draws the panels; the rollout
// browser is in rollouts.js. The API key comes from the URL fragment (#key=..., never sent
// to a server), is kept in this tab's session storage and sent as a bearer token.
"use strict";
(function () {
  const KEY_STORE = "gspo-dashboard-key";
  const POLL_MS = 2000;
  const HIDDEN_POLL_MS = 10000;
  let key = null;
  let ticks = 0;
  let timer = null;

  class KeyNeeded extends Error {}

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) {
      if (c !== null && c !== undefined && c !== false) node.append(c);
    }
    return node;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "\u2013";
    if (Number.isInteger(x)) return x.toLocaleString("en-US");
    const a = Math.abs(x);
    if (a >= 1000) return Math.round(x).toLocaleString("en-US");
    if (a >= 10) return x.toFixed(1);
    return x.toFixed(digits === undefined ? 3 : digits);
  }
  const pct = (x) => (x === null || x === undefined ? "\u2013" : `${(100 * x).toFixed(0)}%`);
  function ago(s) {
    if (s === null || s === undefined) return "never";
    if (s < 90) return `${Math.max(0, s).toFixed(0)} s ago`;
    if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
    return `${(s / 3600).toFixed(1)} h ago`;
  }
  function dl(rows) {
    const out = el("dl");
    for (const [label, value, title] of rows) {
      out.append(el("dt", { text: label, title: title || null }),
                 el("dd", { "data-field": label }, value));
    }
    return out;
  }
  const pill = (cls, text, title) => el("span", { class: `pill ${cls}`, text, title });
  const note = (text) => el("p", { class: "note", text });
  const H = { el, fmt, pct, ago, dl, pill, note };

  function readKey() {
    const m = location.hash.match(/(?:^#|&)key=([^&]*)/);
    if (m) {
      key = decodeURIComponent(m[1]);
      sessionStorage.setItem(KEY_STORE, key);
      history.replaceState(null, "", location.pathname + location.search);
    } else {
      key = sessionStorage.getItem(KEY_STORE);
    }
  }

  async function api(path) {
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    const r = await fetch(path, { headers, cache: "no-store" });
    if (r.status === 401) throw new KeyNeeded(key ? "the key was refused" : "a key is needed");
    if (!r.ok) {
      let why = `${r.status}`;
      try { why += `: ${(await r.json()).error.message}`; } catch (e) { /* not JSON */ }
      throw new Error(why);
    }
    return r.json();
  }

  function setConn(cls, text) {
    const c = document.getElementById("conn");
    c.className = `pill ${cls}`;
    c.textContent = text;
  }

  function card(id, ...children) {
    document.querySelector(`#${id} .body`).replaceChildren(...children.filter((c) => c));
  }

  let P = null;

  function render(s) {
    document.getElementById("server-name").textContent =
      `${s.engine.server_id} \u00b7 ${s.engine.model} (${s.engine.engine})`;
    document.getElementById("updated").textContent =
      `updated ${new Date(s.time * 1000).toLocaleTimeString()}`;
    card("card-learner", ...P.learner(s));
    card("card-queue", ...P.queue(s));
    card("card-fates", ...P.fates(s));
    card("card-rewards", ...P.rewards(s));
    card("card-evals", ...P.evals(s));
    card("card-servers", ...P.servers(s));
  }

  let browser = null;

  async function tick() {
    timer = null;
    try {
      render(await api("v1/dashboard/state"));
      setConn("ok", "live");
      if (ticks++ % 2 === 0) await browser.refreshList();
    } catch (e) {
      if (e instanceof KeyNeeded) {
        askKey(e.message);
        return;  // polling resumes once a key is given
      }
      setConn("bad", `error: ${e.message}`);
    }
    timer = setTimeout(tick, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
  }

  function askKey(why) {
    setConn("warn", "API key needed");
    document.getElementById("key-why").textContent =
      `This server needs its API key (${why}). Open the dashboard with #key=<key> at the ` +
      "end of its URL, or paste the key here (kept in this tab only).";
    document.getElementById("key-form").hidden = false;
  }

  function start() {
    readKey();
    P = window.GSPO_panels(H);
    browser = window.GSPO_rollouts(api, H);
    document.getElementById("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      key = document.getElementById("key-input").value.trim() || null;
      if (key) sessionStorage.setItem(KEY_STORE, key);
      document.getElementById("key-form").hidden = true;
      if (timer === null) tick();
    });
    tick();
  }

  start();
})();
