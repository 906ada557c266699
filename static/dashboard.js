// The dashboards' script (/admin, /usage), loaded with `defer` after
// Chart.js by those pages only: it draws the charts from the numbers the
// page carries as JSON — the same numbers as its tables, which stay the
// accessible and scriptless way to read them — and says so when the live
// backends view could not be refreshed.
'use strict';

(() => {
  // --- Charts ---------------------------------------------------------------
  const source = document.getElementById('usage-chart-data');
  if (source && window.Chart) {
    const data = JSON.parse(source.textContent);
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

    const colour = (p, chart, s, i) => {
      if (chart.palette === 'outcome') return p.outcome[s.key] || p.other;
      if (s.key === 'other') return p.other;
      return p.model[i % p.model.length];
    };

    const draw = () => {
      drawn.forEach((c) => c.destroy());
      drawn.length = 0;
      const p = darkMode.matches ? palettes.dark : palettes.light;
      const style = getComputedStyle(document.body);
      const text = style.color;
      Chart.defaults.font.family = style.fontFamily;
      Chart.defaults.color = text;
      for (const chart of data.charts) {
        const canvas = document.getElementById(chart.canvas);
        if (!canvas) continue;
        drawn.push(new Chart(canvas, {
          type: 'bar',
          data: {
            labels: data.labels,
            datasets: (chart.series || []).map((s, i) => ({
              label: s.label, data: s.data, backgroundColor: colour(p, chart, s, i), borderWidth: 0, maxBarThickness: 28,
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
    draw();
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
