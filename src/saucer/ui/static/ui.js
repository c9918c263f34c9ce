// saucer ui: local times, filter time zone, the version stepper, and the live timeline.
// No inline scripts (the pages' Content-Security-Policy forbids them).
(function () {
  "use strict";

  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.local) return;
      var moment = new Date(el.getAttribute("datetime"));
      if (isNaN(moment.getTime())) return;
      el.title = el.textContent;
      el.textContent = moment.toLocaleString();
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

  function live() {
    var timeline = document.getElementById("timeline");
    if (!timeline || timeline.dataset.live !== "yes" || !window.EventSource) return;
    var note = document.getElementById("live-note");
    var source = new EventSource(timeline.dataset.stream);
    if (note) note.textContent = "following: new steps appear as they commit";
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
      if (data.status) {
        var status = document.getElementById("status");
        if (status) status.textContent = data.status;
      }
    });
    source.addEventListener("end", function () {
      source.close();
      if (note) note.textContent = "the session ended";
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
    live();
    document.body.addEventListener("htmx:afterSwap", function (event) { setup(event.target); });
  });
})();
