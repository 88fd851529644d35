// The ops dashboard: draws what data.json (adapter/analytics/panels.py) holds. plotly.js draws
// the charts; the tiles and number tables are plain DOM, filled with textContent only (the
// addresses in the data come from runtimes and are never parsed as HTML). plotly.js reads a
// few tags (<a href>, <b>, <br>) in the text it draws, so every string a trace carries is
// handed to it with <, > and & as entities, which it shows as those characters.
"use strict";

(function () {
  const root = document.getElementById("dashboard");
  const REFRESH_MS = Number(root.dataset.refreshMs || 10000);

  function utc(ms) {
    return new Date(ms).toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function show(value, column) {
    if (value === null || value === undefined) return "–";
    if (typeof value !== "number") return String(value);
    if (column.endsWith("(ms)")) return utc(value);
    if (Number.isInteger(value)) return value.toLocaleString("en");
    return value.toLocaleString("en", { maximumFractionDigits: 4 });
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function tile(name, value, key) {
    const box = element("div", "tile");
    box.dataset.tile = key;
    box.append(element("span", "", name), element("b", "", value));
    return box;
  }

  function ms(value) {
    return value === null || value === undefined ? "–" : value.toLocaleString("en");
  }

  function drawTiles(data) {
    const tiles = document.getElementById("tiles");
    const latency = data.latency_ms;
    const requests = data.request_latency_ms;
    const range = data.time_range;
    tiles.replaceChildren(
      tile("messages in the window", data.messages.toLocaleString("en"), "messages"),
      tile("send → delivery p50 / p99", `${ms(latency.p50)} / ${ms(latency.p99)} ms`, "latency"),
      tile("request → response p50 / p99", `${ms(requests.p50)} / ${ms(requests.p99)} ms`, "requests"),
      tile(
        "error rate",
        data.error_rate === null || data.error_rate === undefined
          ? "–"
          : `${(100 * data.error_rate).toFixed(2)} %`,
        "errors",
      ),
      tile("events", data.events.toLocaleString("en"), "events"),
      tile("from", range.ts_min ? utc(range.ts_min) : "–", "from"),
      tile("to", range.ts_max ? utc(range.ts_max) : "–", "to"),
      tile("status", data.status, "status"),
    );
    const notes = document.getElementById("notes");
    notes.replaceChildren(...data.notes.map((note) => element("li", "", note)));
    document.getElementById("generated").textContent = data.analysed_ms
      ? `Figures of the analysis finished ${utc(data.analysed_ms)}.`
      : "No analysis yet.";
  }

  function drawTable(box, table) {
    const details = element("details");
    const more = table.total_rows > table.rows.length ? ` (first ${table.rows.length})` : "";
    details.append(element("summary", "", `Numbers: ${table.total_rows} rows${more}`));
    const grid = element("table", "numbers");
    const head = grid.createTHead().insertRow();
    table.columns.forEach((column, i) => {
      const th = element("th", i < table.text_columns ? "text" : "", column.replace("(ms)", "(UTC)"));
      head.append(th);
    });
    const body = grid.createTBody();
    for (const row of table.rows) {
      const tr = body.insertRow();
      row.forEach((value, i) => {
        const td = tr.insertCell();
        td.className = i < table.text_columns ? "text" : "";
        td.textContent = show(value, table.columns[i]);
      });
    }
    details.append(grid);
    box.querySelector("details")?.remove();
    box.append(details);
  }

  function section(panel) {
    let box = document.getElementById(`panel-${panel.id}`);
    if (box) return box;
    let group = document.querySelector(`[data-section="${CSS.escape(panel.section)}"]`);
    if (!group) {
      group = element("section");
      group.dataset.section = panel.section;
      group.append(element("h2", "", panel.section));
      document.getElementById("panels").append(group);
    }
    box = element("figure", "panel");
    box.id = `panel-${panel.id}`;
    box.append(element("figcaption"), element("div", "chart"));
    group.append(box);
    return box;
  }

  function plainText(value) {
    if (typeof value === "string") {
      return value.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    }
    return Array.isArray(value) ? value.map(plainText) : value;
  }

  function asText(traces) {
    return traces.map((trace) => {
      const copy = Object.assign({}, trace);
      for (const key of ["x", "y", "text", "labels", "name", "hovertext", "customdata"]) {
        if (key in copy) copy[key] = plainText(copy[key]);
      }
      return copy;
    });
  }

  function drawPanel(panel) {
    const box = section(panel);
    box.querySelector("figcaption").textContent = panel.title;
    const chart = box.querySelector(".chart");
    if (panel.missing) {
      box.dataset.state = "missing";
      box.dataset.points = "0";
      Plotly.purge(chart);
      chart.replaceChildren(element("p", "empty", `No data: ${panel.missing}.`));
      box.querySelector("details")?.remove();
      return;
    }
    chart.querySelector("p.empty")?.remove();
    box.dataset.state = panel.points > 0 ? "drawn" : "empty";
    box.dataset.points = String(panel.points);
    const layout = Object.assign({ autosize: true }, panel.figure.layout);
    Plotly.react(chart, asText(panel.figure.data), layout, { displaylogo: false, responsive: true });
    drawTable(box, panel.table);
  }

  function render(data) {
    drawTiles(data);
    data.panels.forEach(drawPanel);
    root.dataset.generated = String(data.generated_ms);
    root.dataset.state = "drawn";
  }

  // A token given in the address (?token=…) is kept in memory for the data requests and taken
  // out of the address bar, so it is not in the history or a screenshot.
  const params = new URLSearchParams(window.location.search);
  const token = params.get("token");
  if (token) {
    params.delete("token");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? `?${rest}` : ""));
  }

  async function refresh() {
    const status = document.getElementById("refresh");
    try {
      const response = await fetch(root.dataset.source, {
        cache: "no-store",
        headers: token ? { Authorization: `Bearer ${token}` } : {},
      });
      if (!response.ok) {
        status.textContent = `data.json: ${response.status} ${await response.text()}`;
        return;
      }
      render(await response.json());
      status.textContent = `updated ${utc(Date.now())}; next in ${REFRESH_MS / 1000} s`;
    } catch (error) {
      status.textContent = `data.json unreachable: ${error}`;
    } finally {
      window.setTimeout(refresh, REFRESH_MS);
    }
  }

  if (root.dataset.source) {
    refresh();
  } else {
    render(JSON.parse(document.getElementById("dashboard-data").textContent));
  }
})();
