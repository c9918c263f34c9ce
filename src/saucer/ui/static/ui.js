// saucer ui: local and relative times, filter time zone, the version stepper, the live timeline,
// the step inspector (click, ↑/↓, the address), failures only, and UI trees loaded on demand.
// No inline scripts (the pages' Content-Security-Policy forbids them).
(function () {
  "use strict";

  function ago(moment) {
    var s = Math.round((Date.now() - moment.getTime()) / 1000);
    if (s < 0) s = 0;
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }

  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.local) return;
      var moment = new Date(el.getAttribute("datetime"));
      if (isNaN(moment.getTime())) return;
      if (el.dataset.relative) {
        el.title = moment.toLocaleString();
        el.textContent = ago(moment);
      } else {
        el.title = el.textContent;
        el.textContent = moment.toLocaleString();
      }
      el.dataset.local = "1";
    });
  }

  function zoneOffsets(root) {
    root.querySelectorAll("[data-tz-offset]").forEach(function (el) {
      el.value = String(new Date().getTimezoneOffset());
    });
  }

  function stepper(root) {
    root.querySelectorAll("input[data-autosubmit]").forEach(function (range) {
      var form = range.form;
      var mirror = form.querySelector("input[data-mirror]");
      range.addEventListener("input", function () { if (mirror) mirror.value = range.value; });
      range.addEventListener("change", function () { form.submit(); });
      if (mirror) {
        mirror.addEventListener("change", function () { range.value = mirror.value; form.submit(); });
      }
    });
  }

  function fragment(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    return template.content;
  }

  function uiTrees(root) {
    root.querySelectorAll("details.uitree[data-src]").forEach(function (box) {
      box.addEventListener("toggle", function () {
        if (!box.open || box.dataset.loaded) return;
        box.dataset.loaded = "1";
        var body = box.querySelector(".tree-body");
        fetch(box.dataset.src + "?as=html", { credentials: "same-origin" }).then(function (r) {
          return r.ok ? r.text() : Promise.reject(new Error(r.status + " " + r.statusText));
        }).then(function (html) {
          body.classList.remove("muted");
          body.replaceChildren(fragment(html));
        }).catch(function (err) { body.textContent = "could not load: " + err.message; });
      });
    });
  }

  // ----------------------------------------------------------------- the step inspector

  var inspector = null;

  function steps() {
    var timeline = document.getElementById("timeline");
    if (!timeline) return [];
    var only = timeline.classList.contains("failures-only");
    return Array.prototype.filter.call(timeline.querySelectorAll("li.item:not(.sep)"), function (li) {
      return !only || li.classList.contains("failed");
    });
  }

  function mark(version) {
    document.querySelectorAll("#timeline li.item.selected").forEach(function (li) { li.classList.remove("selected"); });
    var li = document.getElementById("v" + version);
    if (li) {
      li.classList.add("selected");
      var section = li.closest("details");
      if (section) section.open = true;
    }
    return li;
  }

  function address(version) {
    var url = new URL(window.location.href);
    if (version === null) url.searchParams.delete("step"); else url.searchParams.set("step", String(version));
    return url.pathname + url.search;
  }

  function inspect(version, push) {
    var li = mark(version);
    if (!li || !inspector) return;
    var link = li.querySelector("a.inspect");
    inspector.classList.add("open", "loading");
    fetch(link.dataset.fragment, { credentials: "same-origin" }).then(function (r) {
      return r.text().then(function (text) { return r.ok ? text : Promise.reject(new Error(text)); });
    }).then(function (html) {
      inspector.replaceChildren(fragment(html));
      inspector.classList.remove("loading");
      localTimes(inspector);
      uiTrees(inspector);
      if (push) history.pushState({ step: version }, "", address(version));
      li.scrollIntoView({ block: "nearest" });
    }).catch(function (err) {
      inspector.classList.remove("loading");
      inspector.textContent = "could not load this step: " + err.message;
    });
  }

  function close(push) {
    if (!inspector) return;
    mark(null);
    inspector.classList.remove("open");
    inspector.replaceChildren(fragment('<p class="muted hint">click a step to see what it did</p>'));
    if (push) history.pushState({ step: null }, "", address(null));
  }

  function setupInspector() {
    var timeline = document.getElementById("timeline");
    inspector = document.getElementById("inspector");
    if (!timeline || !inspector) return;
    timeline.addEventListener("click", function (event) {
      var link = event.target.closest("a.inspect");
      if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      inspect(Number(link.closest("li.item").dataset.version), true);
    });
    inspector.addEventListener("click", function (event) {
      if (event.target.closest("[data-close]")) { event.preventDefault(); close(true); }
    });
    var selected = inspector.querySelector("#inspected");
    if (selected) { mark(selected.dataset.version); uiTrees(inspector); }
    document.addEventListener("keydown", function (event) {
      if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
      var tag = (event.target.tagName || "").toLowerCase();
      if (tag === "input" || tag === "textarea" || tag === "select" || event.altKey || event.ctrlKey || event.metaKey) return;
      var list = steps();
      if (!list.length) return;
      var current = timeline.querySelector("li.item.selected");
      var at = current ? list.indexOf(current) : -1;
      var next = event.key === "ArrowDown" ? (at < 0 ? 0 : Math.min(at + 1, list.length - 1)) : (at < 0 ? list.length - 1 : Math.max(at - 1, 0));
      if (next === at) return;
      event.preventDefault();
      inspect(Number(list[next].dataset.version), true);
    });
    window.addEventListener("popstate", function () {
      var step = new URL(window.location.href).searchParams.get("step");
      if (step === null) close(false); else inspect(Number(step), false);
    });
    var only = document.getElementById("failures-only");
    if (only) only.addEventListener("change", function () { timeline.classList.toggle("failures-only", only.checked); });
    var first = document.getElementById("first-failure");
    if (first) first.addEventListener("click", function (event) {
      event.preventDefault();
      inspect(Number(first.dataset.version), true);
      var li = document.getElementById("v" + first.dataset.version);
      if (li) li.scrollIntoView({ block: "center" });
    });
  }

  // ------------------------------------------------------------------------- following

  function live() {
    var timeline = document.getElementById("timeline");
    if (!timeline || timeline.dataset.live !== "yes" || !window.EventSource) return;
    var note = document.getElementById("live-note");
    var source = new EventSource(timeline.dataset.stream);
    var status = document.getElementById("status");
    var ended = status && ["finished", "failed", "error", "stopped", "cancelled", "interrupted", "not started"].indexOf(status.textContent) >= 0;
    if (note) note.textContent = ended ? "the session is " + status.textContent + "; following: a resume shows up here" : "following: new steps appear as they commit";
    source.addEventListener("step", function (message) {
      var data = JSON.parse(message.data);
      if (document.getElementById("v" + data.version)) return;
      var section = document.getElementById(data.round_key);
      if (!section) {
        timeline.appendChild(fragment(data.round_html || ""));
        section = document.getElementById(data.round_key);
      }
      if (!section) return;
      var list = section.querySelector("ol.events");
      list.appendChild(fragment(data.html));
      var added = document.getElementById("v" + data.version);
      if (added) localTimes(added);
      var head = document.getElementById("head-version");
      if (head) head.textContent = String(data.version);
      if (data.status && status) {
        status.textContent = data.status;
        var cell = document.getElementById("status-cell");
        if (cell) cell.className = "status-" + data.status.replace(/ /g, "-");
        if (note && data.status === "running") note.textContent = "following: new steps appear as they commit";
        // a cancel is for a running session only (the server refuses the others)
        var cancel = document.getElementById("cancel-form");
        if (cancel) cancel.hidden = data.status !== "running";
      }
    });
    source.addEventListener("end", function (message) {
      if (note) note.textContent = "the session ended (" + message.data + "); still following in case it is resumed";
    });
    source.addEventListener("problem", function (message) {
      source.close();
      if (note) note.textContent = "stopped following: " + message.data;
    });
  }

  function setup(root) {
    localTimes(root);
    zoneOffsets(root);
    stepper(root);
  }

  document.addEventListener("DOMContentLoaded", function () {
    setup(document);
    setupInspector();
    live();
    document.body.addEventListener("htmx:afterSwap", function (event) { setup(event.target); });
  });
})();
