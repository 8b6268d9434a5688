// The priority classes and the top tenants (classes.py): two tables, redrawn on each snapshot.
"use strict";

function fixed(x, digits = 1) { return x == null ? "–" : x.toFixed(digits); }
function seconds(x) { return x == null ? "–" : x < 1 ? (x * 1000).toFixed(0) + " ms" : x.toFixed(2) + " s"; }
function cells(tag, ...values) {
  return values.map((v) => { const c = document.createElement(tag); c.textContent = v; return c; });
}

function classRow(k) {
  const tr = document.createElement("tr");
  tr.dataset.class = k.name;
  tr.append(...cells("td", k.name, String(k.waiting), String(k.in_flight), seconds(k.wait_p50),
    seconds(k.wait_p99), fixed(k.refused_per_s), fixed(k.fairness, 2)));
  return tr;
}

// "batch 75% · interactive 25%": where the tenant's requests went lately.
function mix(classes) {
  const total = Object.values(classes).reduce((a, b) => a + b, 0);
  if (!total) return "–";
  return Object.entries(classes).sort((a, b) => b[1] - a[1])
    .map(([name, rps]) => `${name} ${Math.round((100 * rps) / total)}%`).join(" · ");
}

function tenantRow(t) {
  const tr = document.createElement("tr");
  tr.dataset.tenant = t.tenant;
  tr.append(...cells("td", t.tenant, fixed(t.rps), fixed(t.tokens_per_s, 0), fixed(t.refused_per_s),
    mix(t.classes)));
  return tr;
}

function drawClasses(snap) {
  const classes = snap.classes || [];
  const tenants = snap.tenants || [];
  document.querySelector("#classes tbody").replaceChildren(...classes.map(classRow));
  const body = document.querySelector("#tenants tbody");
  if (tenants.length) {
    body.replaceChildren(...tenants.map(tenantRow));
  } else {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 5;
    td.className = "why";
    td.textContent = "no requests lately";
    tr.append(td);
    body.replaceChildren(tr);
  }
}
