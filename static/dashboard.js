// The dashboards' script (/admin, /usage), loaded with `defer` after
// Chart.js by those pages only: it draws the charts from the numbers the
// page carries as JSON — the same numbers as its tables, which stay the
// accessible and scriptless way to read them — and says so when the live
// backends view could not be refreshed.
'use strict';

(() => {
  // --- Charts ---------------------------------------------------------------
  // Each chart is split by outcome or by model ("Split by"); the page
  // carries both splits. The choice lives in the URL (?split=model) and
  // in the range links, so a reload, a bookmark or another range keeps it.
  const source = document.getElementById('usage-chart-data');
  if (source) {
    const data = JSON.parse(source.textContent);
    const splits = ['model', 'outcome'];
    const asked = new URLSearchParams(window.location.search).get('split');
    let split = splits.includes(asked) ? asked : data.split;
    const darkMode = window.matchMedia('(prefers-color-scheme: dark)');
    // Mid-tones for a white page, lighter ones for a dark page: each stays
    // apart from the background and from its neighbours in either.
    const palettes = {
      light: {
        outcome: { success: '#16a34a', error: '#dc2626', cancelled: '#d97706', stopped: '#0284c7', rejected: '#9333ea' },
        model: ['#4f46e5', '#0891b2', '#ca8a04', '#db2777', '#65a30d', '#ea580c', '#7c3aed', '#0d9488'],
        other: '#94a3b8', grid: 'rgba(0, 0, 0, 0.08)',
      },
      dark: {
        outcome: { success: '#4ade80', error: '#f87171', cancelled: '#fbbf24', stopped: '#38bdf8', rejected: '#c084fc' },
        model: ['#818cf8', '#22d3ee', '#facc15', '#f472b6', '#a3e635', '#fb923c', '#a78bfa', '#2dd4bf'],
        other: '#64748b', grid: 'rgba(255, 255, 255, 0.12)',
      },
    };
    const drawn = [];

    // view is a chart in the current split (older pages: its own series).
    const view = (chart) => (chart.splits && chart.splits[split]) || chart;

    const colour = (p, v, s, i) => {
      if (v.palette === 'outcome') return p.outcome[s.key] || p.other;
      if (s.key === 'other') return p.other;
      return p.model[i % p.model.length];
    };

    const draw = () => {
      drawn.forEach((c) => c.destroy());
      drawn.length = 0;
      if (!window.Chart) return; // the tables still say it all
      const p = darkMode.matches ? palettes.dark : palettes.light;
      const style = getComputedStyle(document.body);
      const text = style.color;
      Chart.defaults.font.family = style.fontFamily;
      Chart.defaults.color = text;
      for (const chart of data.charts) {
        const canvas = document.getElementById(chart.canvas);
        if (!canvas) continue;
        const v = view(chart);
        drawn.push(new Chart(canvas, {
          type: 'bar',
          data: {
            labels: data.labels,
            datasets: (v.series || []).map((s, i) => ({
              label: s.label, data: s.data, backgroundColor: colour(p, v, s, i), borderWidth: 0, maxBarThickness: 28,
            })),
          },
          options: {
            responsive: true,
            maintainAspectRatio: false,
            animation: false,
            interaction: { mode: 'index', intersect: false },
            scales: {
              x: { stacked: true, grid: { display: false }, ticks: { color: text, maxRotation: 0, autoSkip: true } },
              y: { stacked: true, beginAtZero: true, grid: { color: p.grid }, ticks: { color: text, precision: 0 } },
            },
            plugins: {
              legend: { position: 'bottom', labels: { color: text, boxWidth: 12, boxHeight: 12 } },
              tooltip: { filter: (item) => item.raw !== 0 },
            },
          },
        }));
      }
    };

    // withSplit is href (a same-site path) carrying the current split; the
    // default split is left out, so the page's plain URLs stay plain.
    const withSplit = (href) => {
      const url = new URL(href, window.location.href);
      if (split === data.split) url.searchParams.delete('split');
      else url.searchParams.set('split', split);
      return url.pathname + url.search + url.hash;
    };

    // show puts the page in the current split: captions and names of the
    // charts, which table of each is shown, the control, the URL and the
    // range links; then the charts are drawn again.
    const show = () => {
      for (const chart of data.charts) {
        const canvas = document.getElementById(chart.canvas);
        const v = view(chart);
        if (!canvas || !v.caption) continue;
        canvas.setAttribute('aria-label', v.label);
        const caption = canvas.closest('figure') && canvas.closest('figure').querySelector('figcaption');
        if (caption) caption.textContent = v.caption;
      }
      document.querySelectorAll('.chart [data-split]').forEach((el) => { el.hidden = el.dataset.split !== split; });
      document.querySelectorAll('#chart-split input[name="split"]').forEach((r) => { r.checked = r.value === split; });
      document.querySelectorAll('nav.range-switch a[href]').forEach((a) => a.setAttribute('href', withSplit(a.getAttribute('href'))));
      const here = withSplit(window.location.href);
      if (here !== window.location.pathname + window.location.search + window.location.hash) {
        window.history.replaceState(window.history.state, '', here);
      }
      draw();
    };

    const control = document.getElementById('chart-split');
    if (control) {
      control.hidden = false;
      control.addEventListener('change', (event) => {
        if (event.target.name === 'split' && splits.includes(event.target.value)) {
          split = event.target.value;
          show();
        }
      });
    }
    show();
    // The colours follow the system's light or dark mode when it changes.
    darkMode.addEventListener('change', draw);
  }

  // --- Live backends ---------------------------------------------------------
  // The view refreshes itself every 2 s (htmx); when a refresh fails it
  // keeps the last state, and this note says it is no longer live.
  const note = document.getElementById('backends-stale');
  if (note) {
    const fromBackends = (event) => event.detail && event.detail.elt && event.detail.elt.id === 'backends';
    // A failed refresh leaves the element in place: its events still reach
    // the body. A good one replaces it, and the old element's events go
    // nowhere; the new one announces itself with htmx:load.
    document.body.addEventListener('htmx:afterRequest', (event) => {
      if (fromBackends(event) && !event.detail.successful) note.hidden = false;
    });
    document.body.addEventListener('htmx:sendError', (event) => {
      if (fromBackends(event)) note.hidden = false;
    });
    document.body.addEventListener('htmx:load', (event) => {
      if (fromBackends(event)) note.hidden = true;
    });
  }
})();
