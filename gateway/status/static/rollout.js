// The rollout card: the current (or last) rollout's cells, step and gates, from the snapshot.
"use strict";

function rolloutLine(text, cls = "") {
  const p = document.createElement("p");
  if (cls) p.className = cls;
  p.textContent = text;
  return p;
}

function drawRollout(snap) {
  const card = document.getElementById("rollout");
  const r = snap.rollout;
  card.hidden = !r;
  if (!r) return;
  const cells = r.cells.map((cell) => {
    const at = r.cells.indexOf(cell), now = r.cell == null ? -1 : r.cells.indexOf(r.cell);
    const share = at < now ? 100 : at === now ? Math.round(r.share * 100) : 0;
    const live = r.state === "running" || r.state === "paused";
    return live ? `${cell} ${share}%` : cell;
  }).join(" → ");
  const head = rolloutLine(`${r.id}: ${r.state} · ${r.from || '""'} → ${r.to} · ${cells}`);
  head.dataset.state = r.state;
  const gates = r.gates.map((g) => {
    const li = document.createElement("li");
    li.dataset.outcome = g.outcome;
    li.textContent = `${g.gate}: ${g.outcome} (${g.reason})`;
    return li;
  });
  const list = document.createElement("ul");
  list.className = "gates";
  list.append(...gates);
  card.replaceChildren(head, rolloutLine(r.reason || "", "why"), list);
}
