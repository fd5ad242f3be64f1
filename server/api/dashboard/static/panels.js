// gspo-rl dashboard: the panels, each drawn from GET v1/dashboard/state (docs/dashboard.md says
// where each number comes from). Text only through textContent: nothing from Redis is HTML.
"use strict";
window.GSPO_panels = function (H) {
  const { el, fmt, pct, ago, dl, pill, note } = H;

  function stallBox(s) {
    const st = s.learner.last_stall;
    if (!st) return null;
    const ended = st.ended_at !== null && st.ended_at !== undefined;
    const when = ended ? `ended ${ago(s.time - st.ended_at)}` :
      `reported ${ago(s.time - st.at)}, lasting ${fmt(st.for_s, 0)} s then`;
    return el("div", { class: ended ? "stall ended" : "stall" },
              el("strong", { text: `last stall: ${st.reason}` }), ` (${when})`,
              el("div", { text: st.detail }));
  }

  function learner(s) {
    const L = s.learner;
    const status = L.connected ? pill("ok", "connected") : pill("bad", "not connected");
    return [
      el("p", {}, status, " ", el("span", { id: "learner-activity", text: L.activity })),
      dl([
        ["step", fmt(L.step)],
        ["policy version", fmt(L.version)],
        ["pace", L.pace_steps_per_min === null ? "measuring\u2026" :
          `${fmt(L.pace_steps_per_min, 2)} steps/min`, "over the minutes this page watched"],
        ["last published", L.updated_at === null ? "never" : ago(s.time - L.updated_at)],
        ["heartbeat", ago(L.last_seen_s)],
        ["groups trained", fmt(L.groups_trained)],
        ["tokens trained", fmt(L.tokens_trained)],
        ["groups per step", fmt(L.groups_per_step)],
        ["max staleness", L.max_staleness === null ? "none" : fmt(L.max_staleness)],
        ["training now", `${fmt(L.training)} groups`],
      ]),
      L.finished ? el("p", { class: "note", text: `finished: ${L.finished}` }) : null,
      stallBox(s),
    ];
  }

  function queue(s) {
    const q = s.queue;
    if (!q) return [note("This server has no admission gate: the in-flight facts are not read.")];
    const share = q.bound === null ? 0 : q.bound === 0 ? 1 : Math.min(1, q.in_flight / q.bound);
    const meter = el("div", { class: share >= 1 ? "meter full" : "meter" }, el("div"));
    meter.firstChild.style.width = `${(100 * share).toFixed(1)}%`;
    return [
      el("p", {}, `${fmt(q.in_flight)} in flight of `,
         q.bound === null ? "no bound" : `a bound of ${fmt(q.bound)}`, " ",
         q.admission ? pill("ok", "admission on") :
           pill("", "admission off", "this server does not enforce the bound (--no-admission)")),
      meter,
      dl([
        ["open (waiting for rewards)", fmt(q.open)],
        ["open but idle (not counted)", fmt(q.idle)],
        ["complete", fmt(q.complete)],
        ["published, unread", fmt(q.published_unread)],
        ["training", fmt(q.training)],
        ["being sampled", fmt(q.being_sampled)],
        ["no-signal held", fmt(q.no_signal_held), "dropped for equal rewards, holding a place"],
        ["requests held here", fmt(q.requests_held),
          "new groups this server holds at the bound (admission_wait_s) until one fits"],
        ["ready stream length", fmt(q.ready_depth)],
        ["this server behind", `${fmt(Math.max(0, s.learner.version -
          s.engine.policy_version))} versions`, "the bound shrinks by groups per step for each"],
      ]),
    ];
  }

  function fates(s) {
    const f = s.fates;
    const r = s.rates;
    const rows = [
      ["groups generated", fmt(f.generated)],
      ["published", fmt(f.published)],
      ["trained", `${fmt(f.trained)} (${pct(f.trained_group_fraction)})`],
    ];
    for (const [why, n] of Object.entries(f.dropped)) rows.push([why.replace(/_/g, " "), fmt(n)]);
    const frac = f.trained_token_fraction;
    rows.push(["in flight", fmt(f.in_flight)],
              ["tokens generated", fmt(f.tokens_generated)],
              ["tokens trained", `${fmt(f.tokens_trained)} (${pct(frac)})`],
              ["waste, tokens not trained", frac === null ? "\u2013" : pct(Math.max(0, 1 - frac)),
                "the share of generated tokens not trained: dropped, or still in flight"]);
    const out = [dl(rows)];
    if (r.window_s > 0) {
      out.push(dl([
        ["tokens/s generated", fmt(r.tokens_generated_per_s, 1)],
        ["tokens/s trained", fmt(r.tokens_trained_per_s, 1)],
        ["groups/min generated", fmt(r.groups_generated_per_min, 1)],
        ["groups/min trained", fmt(r.groups_trained_per_min, 1)],
      ]), note(`rates over the last ${fmt(r.window_s, 0)} s this page watched`));
    } else {
      out.push(note("rates: measuring (they need a few seconds of watching)"));
    }
    return out;
  }

  function rewards(s) {
    const w = s.rewards;
    return [
      dl([
        ["sampled, all groups", fmt(w.sampled_mean), "mean reward per sample of every group " +
          "that finished with rewards (published or dropped for equal rewards)"],
        ["sampled groups", fmt(w.sampled_groups)],
        ["sampled, recent", fmt(w.sampled_recent_mean), "groups that finished while watched"],
        ["trained, last step", fmt(w.trained_last_mean),
          "mean reward per sample of the groups the learner's last step trained"],
        ["trained, recent steps", w.trained_recent_mean === null ? fmt(null) :
          `${fmt(w.trained_recent_mean)} over ${fmt(w.trained_recent_steps)} steps`,
          "the same over its last steps (at most 20)"],
        [`published, last ${w.published_recent_groups}`, fmt(w.published_recent_mean),
          "groups on the ready stream: what the learner reads (never equal-reward groups)"],
      ]),
      note("Sampled: what the environment scored. Trained: the groups the learner's steps " +
           "trained, as it publishes them. Published: the groups with a learning signal " +
           "waiting for it or read by it. " + (w.trained_last_mean === null ?
             "No trained reward yet (no step, or a learner that does not publish it)." : "")),
    ];
  }

  function evals(s) {
    if (!s.evals.length) return [note("No evaluation posted yet (POST /v1/evals).")];
    const rows = s.evals.map((e) => el("tr", {},
      el("td", { text: e.name }), el("td", { class: "num", text: fmt(e.policy_version) }),
      el("td", { text: Object.entries(e.metrics).map(([k, v]) => `${k} ${fmt(v)}`)
        .join(", ") })));
    return [el("table", {}, el("thead", {}, el("tr", {}, el("th", { text: "eval set" }),
      el("th", { text: "version" }), el("th", { text: "metrics" }))), el("tbody", {}, ...rows))];
  }

  function syncCell(s, w) {
    if (!w) return el("span", { class: "muted", text: "none yet" });
    const since = ago(s.time - w.started_at);
    if (w.state === "receiving") {
      return el("span", {}, pill("warn", `receiving v${w.version}`),
                ` for ${fmt(Math.max(0, s.time - w.started_at), 0)} s`);
    }
    if (w.state === "failed") {
      return el("span", { title: w.error || "" }, pill("bad", `v${w.version} failed`),
                ` ${since}: ${w.error || "no reason given"}`);
    }
    return el("span", {}, pill("ok", `v${w.version} loaded`),
              ` ${since}, in ${fmt(w.duration_s, 2)} s`);
  }

  function serverRow(s, v) {
    const load = v.load ? `${fmt(v.load.running)} running, ${fmt(v.load.waiting)} waiting` :
      "\u2013";
    return el("tr", { "data-server": v.server_id },
      el("td", { "data-col": "server", text: v.server_id + (v.this ? " (this)" : ""),
                 title: v.url }),
      el("td", { "data-col": "engine", text: v.engine }),
      el("td", { "data-col": "version", class: "num", text: fmt(v.policy_version) }),
      el("td", { "data-col": "load", text: load }),
      el("td", { "data-col": "weight sync" }, syncCell(s, v.weight_sync)),
      el("td", { "data-col": "heartbeat", text: v.problem ? v.problem : ago(v.heartbeat_age_s) }));
  }

  function servers(s) {
    const e = s.engine;
    const extra = Object.entries(e.extra).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    const head = ["server", "engine", "version", "load", "weight sync", "heartbeat"];
    return [
      el("p", {}, `this server: ${fmt(e.running)} running, ${fmt(e.waiting)} waiting`),
      extra ? note(`engine: ${extra}`) : null,
      el("table", {}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
         el("tbody", {}, ...s.servers.map((v) => serverRow(s, v)))),
      note("load and weight sync: as each server reported them at its last heartbeat " +
           "(every 2 s)"),
    ];
  }

  return { learner, queue, fates, rewards, evals, servers };
};
