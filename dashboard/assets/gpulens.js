/* gpulens dashboard: the theme, URL state and click-through, done in the browser (no server round trip). */
(function () {
  "use strict";

  var THEME_KEY = "gpulens-theme";

  function storedTheme() {
    try {
      var value = window.localStorage.getItem(THEME_KEY);
      if (value === "light" || value === "dark") {
        return value;
      }
    } catch (err) {
      /* storage disabled: fall back to the system preference */
    }
    var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
    return dark ? "dark" : "light";
  }

  function applyTheme(theme) {
    document.documentElement.setAttribute("data-theme", theme);
    try {
      window.localStorage.setItem(THEME_KEY, theme);
    } catch (err) {
      /* not persisted: the theme still applies to this page */
    }
  }

  // Before the first paint, so a dark-theme user never sees a white flash.
  document.documentElement.setAttribute("data-theme", storedTheme());

  window.dash_clientside = Object.assign({}, window.dash_clientside, {
    gpulens: {
      /* Theme button: the first call (page load) applies the stored theme, each click flips it. */
      toggleTheme: function (nClicks) {
        var theme = storedTheme();
        if (nClicks) {
          theme = theme === "dark" ? "light" : "dark";
        }
        applyTheme(theme);
        return theme === "dark" ? "\u2600 Light" : "\u263E Dark";
      },

      /* Write the page's state into the URL (replaceState: no navigation, no re-render), so a link can be shared.
         Arguments: the state values in order, then the list of their query-parameter names. */
      syncUrl: function () {
        var args = Array.prototype.slice.call(arguments);
        var keys = args.pop() || [];
        var params = new URLSearchParams();
        keys.forEach(function (key, i) {
          var value = args[i];
          if (value !== null && value !== undefined && value !== "") {
            params.set(key, String(value));
          }
        });
        var search = params.toString();
        var target = window.location.pathname + (search ? "?" + search : "");
        if (target !== window.location.pathname + window.location.search) {
          window.history.replaceState(window.history.state, "", target);
        }
        return search;
      },

      /* Auto-refresh choice ("30s", "5m" or "off") -> the dcc.Interval's period and whether it is disabled. */
      refreshInterval: function (value) {
        var match = /^(\d+)(s|m)$/.exec(value || "");
        var seconds = match ? Number(match[1]) * (match[2] === "m" ? 60 : 1) : 0;
        return [seconds > 0 ? seconds * 1000 : 3600000, !(seconds > 0)];
      },

      /* The custom from/to inputs show only for the "custom" range. */
      customVisibility: function (range) {
        return range === "custom" ? "gl-custom" : "gl-custom hidden";
      },

      /* A click on a point whose customdata (scatter) or hovertext (heatmap) is a page path navigates there. */
      clickThrough: function (clickData) {
        var point = clickData && clickData.points && clickData.points[0];
        var isPath = function (value) {
          return typeof value === "string" && value.charAt(0) === "/";
        };
        var path = point && [point.customdata, point.hovertext].filter(isPath)[0];
        if (!path) {
          return window.dash_clientside.no_update;
        }
        var search = new URLSearchParams(window.location.search);
        var keep = new URLSearchParams();
        ["range", "from", "to", "refresh"].forEach(function (key) {
          if (search.has(key)) {
            keep.set(key, search.get(key));
          }
        });
        var query = keep.toString();
        return path + (query ? "?" + query : "");
      }
    }
  });
})();
