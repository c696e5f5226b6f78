/* gpulens dashboard: start loading Plotly as the page starts, not after the first callback answers.
 *
 * dcc.Graph loads Plotly only when a graph is first rendered, i.e. after the page's callback has answered, and then
 * compiles it: the two waits add up. Here the script is requested at once (async) and window.Plotly holds a promise
 * until it has run; dcc.Graph's loader does Promise.resolve(window.Plotly || load()), so it waits on this promise
 * instead of loading Plotly a second time. The bundle then sets window.Plotly itself.
 *
 * The script is plotly.js's partial bundle of cartesian traces (assets/vendor, 1.5 MB), not the full 4.8 MB one
 * dcc.Graph would load: the dashboard draws only scatter and heatmap traces, and the browser compiles a third as
 * much. Should it fail to load, dcc.Graph loads the full bundle itself.
 *
 * Once loaded, Plotly.Plots.resize returns at once for a chart whose container has the chart's size already. dcc.Graph
 * calls it after every first draw, and again when its resize observer first reports: twenty calls on a ten-chart page,
 * each waiting Plotly's 100 ms debounce and then relaying the chart out at the size it has (Plotly compares the sizes
 * only then). Those waits held the page's last chart for about 0.3 s (docs/dashboard.md, "Sizing and speed").
 *
 * The alerts page draws no chart and skips it (Dash navigates between pages without reloading, so Plotly loaded on
 * any page stays for the next).
 */
(function () {
  "use strict";
  if (window.Plotly) {
    return;
  }
  var prefix = "/";
  try {
    var config = document.getElementById("_dash-config");
    prefix = JSON.parse(config.textContent).requests_pathname_prefix || "/";
  } catch (err) {
    /* no config: the app is at the root */
  }
  if (window.location.pathname.indexOf(prefix + "alerts") === 0) {
    return;
  }
  function fitsAlready(gd) {
    var full = gd && gd._fullLayout;
    if (!full || !gd.isConnected) {
      return false;
    }
    var style = window.getComputedStyle(gd);
    return Math.abs(parseFloat(style.width) - full.width) <= 1 && Math.abs(parseFloat(style.height) - full.height) <= 1;
  }
  function skipResizeWhenFitting(plotly) {
    var resize = plotly && plotly.Plots && plotly.Plots.resize;
    if (typeof resize !== "function") {
      return;
    }
    plotly.Plots.resize = function (gd) {
      var div = typeof gd === "string" ? document.getElementById(gd) : gd;
      return fitsAlready(div) ? Promise.resolve(div) : resize.apply(this, arguments);
    };
  }
  var script = document.createElement("script");
  script.src = prefix + "assets/vendor/plotly-cartesian-4.1.1.min.js";
  script.async = true;
  var loading = new Promise(function (resolve, reject) {
    script.onload = function () {
      skipResizeWhenFitting(window.Plotly);
      resolve();
    };
    script.onerror = function (err) {
      if (window.Plotly === loading) {
        window.Plotly = undefined; /* dcc.Graph then tries its own load, and reports its own error */
      }
      reject(err);
    };
  });
  loading.catch(function () {});
  window.Plotly = loading;
  document.head.appendChild(script);
})();
