// gspo-rl dashboard: the rollout browser. The list polls GET v1/dashboard/groups; a click reads
// GET v1/dashboard/groups/{id}: each episode's turns, the model's tokens shaded by their
// log-probability, their importance ratio pi_prox / pi_behavior (once the learner trained
// them), their turn's advantage or their policy version (the selector).
"use strict";
window.GSPO_rollouts = function (api, H) {
  const { el, fmt, ago, pill } = H;
  const list = document.getElementById("group-list");
  const box = document.getElementById("group-detail");
  const select = document.getElementById("shade");
  const legend = document.getElementById("legend");
  const PALETTE = ["#bfdbfe", "#fde68a", "#bbf7d0", "#fbcfe8", "#ddd6fe", "#fed7aa", "#a5f3fc",
                   "#e5e7eb"];
  const WHERE = {
    unread: ["", "unread", "published; the learner has not read it yet"],
    delivered: ["warn", "in a step", "read by the learner, not yet acknowledged"],
    acknowledged: ["ok", "acked", "acknowledged by the learner: trained (or dropped as stale)"],
    no_signal: ["bad", "no signal", "dropped: every reward equal, never published"],
  };
  let shade = select.value;
  let selected = null;
  let scale = { maxAdv: 1, versions: [] };
  const RATIO_CLAMP = 0.5; // |log ratio| at which the shading is deepest

  select.addEventListener("change", () => { shade = select.value; recolor(); });

  function chip(r) {
    const c = el("span", { class: "chip", text: fmt(r, 2) });
    c.style.background = `rgba(21, 128, 61, ${(0.1 + 0.5 * Math.max(0, Math.min(1, r))).toFixed(2)})`;
    return c;
  }

  function row(g, now) {
    const [cls, text, title] = WHERE[g.where];
    const mean = g.rewards.length ? g.rewards.reduce((a, b) => a + b, 0) / g.rewards.length : null;
    const labels = Object.entries(g.labels).map(([k, v]) => `${k} ${v}`).join(" \u00b7 ");
    const b = el("button", { class: "group-row", type: "button", "data-group": g.group_id },
      el("div", { class: "top" }, pill(cls, text, title),
         el("span", { class: "muted", text: `${ago(now - g.time)} \u00b7 mean ${fmt(mean, 2)}` })),
      el("div", { class: "id", text: g.group_id, title: g.group_id }),
      labels ? el("div", { class: "muted", text: labels }) : null,
      el("div", { class: "chips" }, ...g.rewards.slice(0, 32).map(chip)));
    if (g.group_id === selected) b.classList.add("selected");
    b.addEventListener("click", () => open(g.group_id));
    return b;
  }

  async function refreshList() {
    const data = await api("v1/dashboard/groups?limit=20");
    if (!data.groups.length) return;
    const now = Date.now() / 1000;
    list.replaceChildren(...data.groups.map((g) => row(g, now)));
    if (selected === null) await open(data.groups[0].group_id);
  }

  async function open(gid) {
    selected = gid;
    for (const b of list.querySelectorAll(".group-row")) {
      b.classList.toggle("selected", b.dataset.group === gid);
    }
    box.replaceChildren(el("p", { class: "muted", text: "loading\u2026" }));
    try {
      const d = await api(`v1/dashboard/groups/${encodeURIComponent(gid)}?rollouts=16&max_tokens=512`);
      if (selected === gid) draw(d);
    } catch (e) {
      box.replaceChildren(el("p", { class: "muted", text: `could not read ${gid}: ${e.message}` }));
    }
  }

  function tokenSpan(seg, i) {
    const s = el("span", { class: "tok", text: seg.tokens[i] });
    s.dataset.lp = seg.logprobs[i];
    s.dataset.v = seg.versions[i];
    if (seg.advantage !== null && seg.advantage !== undefined) s.dataset.a = seg.advantage;
    const lr = seg.log_ratios ? seg.log_ratios[i] : null;
    if (lr !== null && lr !== undefined) s.dataset.lr = lr;
    s.title = `${JSON.stringify(seg.tokens[i])}  log p ${fmt(seg.logprobs[i])}  ` +
      `p ${fmt(Math.exp(seg.logprobs[i]))}  version ${seg.versions[i]}  ` +
      `advantage ${fmt(seg.advantage)}  ` +
      (lr === null || lr === undefined ? "ratio none (not trained yet, or expired)"
        : `ratio ${Math.exp(lr).toFixed(3)}`);
    return s;
  }

  function segment(seg) {
    if (seg.kind === "context") return el("div", { class: "context", text: seg.text });
    const label = [`turn ${seg.turn}`];
    if (seg.reward !== null && seg.reward !== undefined) label.push(`reward ${fmt(seg.reward)}`);
    label.push(`advantage ${fmt(seg.advantage)}`, `${seg.tokens.length} tokens`);
    const toks = el("div", { class: "tokens" }, ...seg.tokens.map((_, i) => tokenSpan(seg, i)));
    if (seg.truncated) toks.append(el("span", { class: "cut", text: ` [+${seg.truncated} tokens not shown]` }));
    const turn = el("div", { class: "turn", "data-turn": seg.turn },
                    el("div", { class: "label", text: label.join(" \u00b7 ") }), toks);
    if (seg.reward !== null && seg.reward !== undefined) turn.dataset.reward = seg.reward;
    if (seg.advantage !== null && seg.advantage !== undefined) {
      turn.dataset.advantage = seg.advantage;
    }
    return turn;
  }

  function draw(d) {
    const versions = new Set();
    let maxAdv = 0;
    for (const r of d.rollouts) {
      for (const seg of r.segments) {
        if (seg.kind !== "model") continue;
        seg.versions.forEach((v) => versions.add(v));
        if (seg.advantage !== null) maxAdv = Math.max(maxAdv, Math.abs(seg.advantage));
      }
    }
    scale = { maxAdv: maxAdv || 1, versions: [...versions].sort((a, b) => a - b) };
    const head = el("p", {}, el("strong", { text: d.group_id }),
      ` \u00b7 ${d.state}` + (d.drop_reason ? ` (${d.drop_reason})` : "") +
      (d.advantages_from === "none" ? " \u00b7 no advantages (not published)" : "") +
      (d.missing ? ` \u00b7 ${d.missing} episodes expired` : ""));
    const cards = d.rollouts.map((r) => el("div", { class: "rollout", "data-rollout": r.rollout_id },
      el("div", { class: "head" }, el("strong", { text: r.rollout_id }),
         el("span", { text: `reward ${fmt(r.reward)}` }),
         el("span", { text: `advantage ${fmt(r.advantage)}` }),
         el("span", { text: `finish ${r.finish_reason}` }),
         el("span", { class: "muted", text: `${r.n_model_tokens} of ${r.n_tokens} tokens sampled` })),
      el("div", { class: "segments" }, ...r.segments.map(segment))));
    box.replaceChildren(head, ...cards);
    recolor();
  }

  function colorOf(span) {
    if (shade === "logprob") {
      const a = Math.min(1, Math.max(0, -Number(span.dataset.lp) / 5));
      return `rgba(220, 38, 38, ${(0.75 * a).toFixed(3)})`;
    }
    if (shade === "ratio") {
      if (span.dataset.lr === undefined) return "transparent";
      return ratioColor(Number(span.dataset.lr));
    }
    if (shade === "advantage") {
      if (span.dataset.a === undefined) return "transparent";
      const a = Number(span.dataset.a);
      const t = (0.1 + 0.6 * Math.min(1, Math.abs(a) / scale.maxAdv)).toFixed(3);
      return a >= 0 ? `rgba(22, 163, 74, ${t})` : `rgba(220, 38, 38, ${t})`;
    }
    const i = scale.versions.indexOf(Number(span.dataset.v));
    return PALETTE[Math.max(0, i) % PALETTE.length];
  }

  // Diverging around ratio 1: blue where the learner gives the token more probability than the
  // sampler did, orange where less, deepest from |log ratio| = RATIO_CLAMP on.
  function ratioColor(lr) {
    const x = Math.max(-1, Math.min(1, lr / RATIO_CLAMP));
    const t = (0.75 * Math.abs(x)).toFixed(3);
    return x >= 0 ? `rgba(37, 99, 235, ${t})` : `rgba(234, 88, 12, ${t})`;
  }

  function swatch(color, text) {
    const s = el("span", { class: "swatch" });
    s.style.background = color;
    return el("span", {}, s, ` ${text}`);
  }

  function drawLegend() {
    let items;
    if (shade === "logprob") {
      items = [swatch("rgba(220, 38, 38, 0)", "p \u2248 1"), swatch("rgba(220, 38, 38, 0.375)", "log p = -2.5"),
               swatch("rgba(220, 38, 38, 0.75)", "log p \u2264 -5")];
    } else if (shade === "ratio") {
      const lo = Math.exp(-RATIO_CLAMP).toFixed(2), hi = Math.exp(RATIO_CLAMP).toFixed(2);
      const bare = [...box.querySelectorAll(".tok")].filter((t) => t.dataset.lr === undefined);
      items = [swatch(ratioColor(-RATIO_CLAMP), `\u2264 ${lo}`), swatch(ratioColor(0), "1"),
               swatch(ratioColor(RATIO_CLAMP), `\u2265 ${hi}`)];
      if (bare.length) {
        items.push(el("span", { class: "muted ratio-note",
          text: `${bare.length} tokens unshaded: no ratio yet (not trained, dropped or expired)` }));
      }
    } else if (shade === "advantage") {
      items = [swatch("rgba(220, 38, 38, 0.7)", `-${fmt(scale.maxAdv, 2)}`),
               swatch("rgba(22, 163, 74, 0.7)", `+${fmt(scale.maxAdv, 2)}`)];
    } else {
      items = scale.versions.map((v, i) => swatch(PALETTE[i % PALETTE.length], `v${v}`));
    }
    legend.replaceChildren(...items);
  }

  function recolor() {
    box.dataset.shade = shade;
    for (const s of box.querySelectorAll(".tok")) s.style.backgroundColor = colorOf(s);
    drawLegend();
  }

  return { refreshList, open };
};
