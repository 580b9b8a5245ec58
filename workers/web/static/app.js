// The answer page. Everything an asker wrote arrives as JSON strings and goes into the page
// with textContent; only `detailHtml` (markdown rendered and sanitised by the server) is
// inserted as HTML. No inline script: the page runs under a strict Content-Security-Policy.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const state = { csrf: null, user: null, source: null, status: "connecting", skewMs: 0, cards: new Map() };
  const RECOMMENDED = /\s*\(recommended\)\s*$/i;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  // -- talking to the server -------------------------------------------------------------

  async function call(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    if (state.csrf) headers["X-CSRF-Token"] = state.csrf;
    const response = await fetch(path, {
      method, headers, credentials: "same-origin", body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const error = new Error((data && data.message) || response.statusText);
      error.code = (data && data.code) || String(response.status);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  async function boot() {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    setInterval(refreshAges, 15000);
    try {
      start(await call("GET", "/api/session"));
    } catch (error) {
      showSignIn();
    }
  }

  function showSignIn(message) {
    if (state.source) state.source.close();
    state.source = null;
    state.csrf = null;
    $("main").hidden = true;
    $("sign-out").hidden = true;
    $("who").textContent = "";
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = message || "";
  }

  async function signIn(event) {
    event.preventDefault();
    const token = $("token").value;
    const body = token ? { token } : { user: $("user").value, password: $("password").value };
    $("sign-in-button").disabled = true;
    try {
      start(await call("POST", "/api/session", body));
      $("password").value = "";
      $("token").value = "";
    } catch (error) {
      $("sign-in-error").textContent = error.message;
    } finally {
      $("sign-in-button").disabled = false;
    }
  }

  async function signOut() {
    try { await call("DELETE", "/api/session"); } catch (e) { /* signed out anyway */ }
    for (const id of [...state.cards.keys()]) dropCard(id);
    showSignIn();
  }

  function start(session) {
    state.csrf = session.csrf;
    state.user = session.user;
    $("who").textContent = "signed in as " + session.user;
    $("namespace").textContent = "namespace " + session.namespace;
    $("sign-in").hidden = true;
    $("main").hidden = false;
    $("sign-out").hidden = false;
    const source = new EventSource("/api/events");
    state.source = source;
    source.addEventListener("snapshot", (e) => onSnapshot(JSON.parse(e.data)));
    source.addEventListener("status", (e) => onStatus(JSON.parse(e.data)));
    source.addEventListener("added", (e) => addCard(JSON.parse(e.data).request));
    source.addEventListener("removed", (e) => onRemoved(JSON.parse(e.data)));
    source.addEventListener("error", async () => {
      if (source.readyState !== EventSource.CLOSED) {
        setBanner("Connection lost; reconnecting…", true);
        return;
      }
      try { await call("GET", "/api/session"); setTimeout(() => { if (state.source === source) start(session); }, 1000); }
      catch (error) { showSignIn("Your session ended; sign in again."); }
    });
  }

  // -- the live list -----------------------------------------------------------------------

  function onSnapshot(snapshot) {
    state.skewMs = snapshot.nowMs - Date.now();
    onStatus(snapshot.status);
    const live = new Set(snapshot.requests.map((r) => r.id));
    for (const [id, card] of state.cards) if (!live.has(id) && !card.closed) closeOrDrop(id, "gone", "");
    for (const request of snapshot.requests) addCard(request);
  }

  function setBanner(text, bad) {
    const banner = $("banner");
    banner.hidden = !text;
    banner.textContent = text || "";
    banner.className = bad ? "bad" : "";
  }

  function onStatus(status) {
    state.status = status.status;
    document.body.dataset.status = status.status;
    if (status.status === "active") setBanner("");
    else if (status.status === "standby")
      setBanner("Standing by: " + (status.holder || "another provider") + " is serving this namespace. "
        + "Questions appear here if this server takes over.");
    else if (status.status === "stopped") setBanner("This server is stopping.", true);
    else setBanner("Connecting to the broker…", true);
    for (const card of state.cards.values()) arm(card);
  }

  function onRemoved(event) {
    const card = state.cards.get(event.id);
    if (!card || card.submitting) return;  // our own submission settles the card itself
    closeOrDrop(event.id, event.reason, event.by);
  }

  function closeOrDrop(id, reason, by) {
    const card = state.cards.get(id);
    if (!card) return;
    if (!card.dirty) { dropCard(id); return; }
    // Keep what the person typed; say why it can no longer be sent.
    const who = by ? " by " + by : "";
    const why = {
      answered: "Already answered" + who + ".",
      cancelled: "Already cancelled" + who + ".",
      withdrawn: "The agent withdrew this question.",
      lost: "This server lost the lease; the question goes to the provider that takes over.",
    }[reason] || "This question is no longer pending.";
    closeCard(card, why);
  }

  function closeCard(card, message) {
    card.closed = true;
    card.root.classList.add("closed");
    notice(card, message, true);
    arm(card);
    if (!card.root.querySelector(".dismiss"))
      card.actions.append(el("button", { type: "button", class: "dismiss", text: "Dismiss", onclick: () => dropCard(card.id) }));
  }

  function dropCard(id) {
    const card = state.cards.get(id);
    if (card) card.root.remove();
    state.cards.delete(id);
    $("empty").hidden = state.cards.size > 0;
  }

  function refreshAges() {
    for (const card of state.cards.values()) card.age.textContent = age(card.request.createdMs);
  }

  function age(createdMs) {
    const seconds = Math.max(0, Math.round((Date.now() + state.skewMs - createdMs) / 1000));
    if (seconds < 60) return "asked just now";
    if (seconds < 3600) return "asked " + Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) return "asked " + Math.floor(seconds / 3600) + " h ago";
    return "asked " + Math.floor(seconds / 86400) + " d ago";
  }

  // -- a card per request ----------------------------------------------------------------

  function addCard(request) {
    if (state.cards.has(request.id)) return;
    const root = el("article", { class: "card", "data-id": request.id });
    const ageNode = el("span", { class: "age", text: age(request.createdMs) });
    const headers = request.questions.map((q) => q.header).filter((h) => h);
    root.append(el("div", { class: "meta" },
      el("span", { class: "agent", text: request.agent || "anonymous agent" }),
      ageNode,
      headers.length ? el("span", { class: "headers", text: headers.join(" · ") }) : null,
      el("span", { text: request.questions.length + (request.questions.length === 1 ? " question" : " questions") })));
    const card = { id: request.id, request, root, age: ageNode, dirty: false, closed: false, submitting: false };
    root.addEventListener("input", () => {
      card.dirty = true;
      if (!card.closed && !card.submitting && card.notice) notice(card, "");
    });
    state.cards.set(request.id, card);
    const only = request.questions.length === 1 ? request.questions[0] : null;
    if (only && only.planReview) renderPlan(card, only);
    else renderForm(card);
    $("requests").append(root);
    $("empty").hidden = true;
  }

  function clearBody(card) {
    while (card.root.childNodes.length > 1) card.root.lastChild.remove();
  }

  function detailNode(question) {
    if (question.detailHtml === null || question.detailHtml === undefined) return null;
    const node = el("div", { class: "detail" });
    node.innerHTML = question.detailHtml;  // sanitised by the server (raw HTML off, safe links only)
    return node;
  }

  function labelNode(label) {
    const shown = label.replace(RECOMMENDED, "");
    const node = el("span", { class: "label", text: shown || label });
    if (shown && shown !== label) return el("span", {}, node, el("span", { class: "badge recommended", text: "Recommended" }));
    return node;
  }

  function renderPlan(card, question) {
    clearBody(card);
    card.kind = "plan";
    card.root.classList.add("plan-card");
    const review = question.planReview;
    card.root.append(
      el("p", { class: "question-text" }, question.header ? el("span", { class: "header-chip", text: question.header }) : null,
        el("span", { text: question.question })),
      detailNode(question));
    const approve = el("button", { type: "button", class: "primary approve", onclick: () => sendPlan(card, question, review.approve) }, labelNode(review.approve));
    const refuse = review.refuse === null ? null
      : el("button", { type: "button", class: "refuse", onclick: () => sendPlan(card, question, review.refuse) }, labelNode(review.refuse));
    const chat = el("button", { type: "button", class: "cancel", text: "Chat about it", onclick: () => cancelBatch(card) });
    const full = el("button", { type: "button", class: "link full-form", text: "Other answer…", onclick: () => { card.root.classList.remove("plan-card"); renderForm(card); } });
    card.actions = el("div", { class: "actions" }, approve, refuse, chat, full);
    card.notice = el("p", { class: "notice", role: "alert" });
    card.root.append(card.actions, card.notice);
    arm(card);
  }

  function renderForm(card) {
    clearBody(card);
    card.kind = "form";
    const form = el("form", { class: "answer-form", novalidate: true });
    for (const question of card.request.questions) form.append(questionNode(card, question));
    const send = el("button", { type: "submit", class: "primary send", text: "Send answers" });
    const cancel = el("button", { type: "button", class: "danger cancel", text: "Cancel batch", onclick: () => cancelBatch(card) });
    card.actions = el("div", { class: "actions" }, send, cancel);
    card.notice = el("p", { class: "notice", role: "alert" });
    form.append(card.actions, card.notice);
    form.addEventListener("submit", (event) => { event.preventDefault(); sendForm(card, form); });
    card.root.append(form);
    arm(card);
  }

  function questionNode(card, question) {
    const name = card.id + ":" + question.id;
    const fieldset = el("fieldset", { class: "question", "data-qid": question.id });
    fieldset.append(el("p", { class: "question-text" },
      question.header ? el("span", { class: "header-chip", text: question.header }) : null,
      el("span", { text: question.question })));
    const detail = detailNode(question);
    if (detail) fieldset.append(detail);
    const choices = el("div", { class: "choices" });
    const type = question.multiSelect ? "checkbox" : "radio";
    for (const option of question.options) {
      choices.append(el("label", { class: "choice" },
        el("input", { type, name, value: option.label, class: "option" }),
        labelNode(option.label),
        option.description ? el("span", { class: "desc", text: option.description }) : null));
    }
    const other = el("textarea", { class: "other", name: name + ":other", "aria-label": "Other answer", placeholder: question.options.length ? "Other…" : "Your answer" });
    if (question.options.length) {
      const otherBox = el("input", { type, name, value: "", class: "other-choice" });
      choices.append(el("label", { class: "choice" }, otherBox, el("span", { text: "Other" })));
      other.addEventListener("input", () => { if (other.value.trim()) otherBox.checked = true; });
    }
    choices.append(other);
    fieldset.append(choices);
    const skip = el("input", { type: "checkbox", class: "skip-box" });
    skip.addEventListener("change", () => { for (const input of choices.querySelectorAll("input, textarea")) input.disabled = skip.checked; });
    fieldset.append(el("label", { class: "skip" }, skip, " Skip this question"));
    return fieldset;
  }

  function collect(card, form) {
    const answers = [];
    for (const question of card.request.questions) {
      const fieldset = [...form.querySelectorAll("fieldset.question")].find((f) => f.dataset.qid === question.id);
      if (fieldset.querySelector(".skip-box").checked) { answers.push({ id: question.id, selected: [] }); continue; }
      const selected = [...fieldset.querySelectorAll("input.option")].filter((i) => i.checked).map((i) => i.value);
      const otherBox = fieldset.querySelector("input.other-choice");
      const text = fieldset.querySelector("textarea.other").value;
      const wantsOther = otherBox ? otherBox.checked : text.trim() !== "";
      const item = { id: question.id, selected: question.multiSelect || !wantsOther ? selected : [] };
      if (wantsOther) {
        if (!text.trim()) throw new Error("Write the Other answer to “" + question.question + "”, or pick an option.");
        item.custom = text;
      }
      if (!item.selected.length && item.custom === undefined)
        throw new Error("Answer or skip “" + question.question + "”.");
      answers.push(item);
    }
    return { answers };
  }

  function notice(card, text, bad) {
    card.notice.textContent = text || "";
    card.notice.className = "notice" + (bad ? " bad" : "");
  }

  function arm(card) {
    const off = card.closed || card.submitting || state.status !== "active";
    for (const button of card.actions ? card.actions.querySelectorAll("button:not(.dismiss)") : []) button.disabled = off;
  }

  async function settle(card, path, body) {
    card.submitting = true;
    notice(card, "Sending…");
    arm(card);
    try {
      await call("POST", "/api/requests/" + encodeURIComponent(card.id) + path, body);
      dropCard(card.id);
    } catch (error) {
      card.submitting = false;
      if (error.code === "NOT_PENDING") { closeCard(card, error.message); return; }
      notice(card, error.code + ": " + error.message, true);
      arm(card);
    }
  }

  function sendForm(card, form) {
    let answer;
    try { answer = collect(card, form); } catch (error) { notice(card, error.message, true); return; }
    settle(card, "/answer", answer);
  }

  function sendPlan(card, question, label) {
    card.dirty = true;
    settle(card, "/answer", { answers: [{ id: question.id, selected: [label] }] });
  }

  function cancelBatch(card) {
    settle(card, "/cancel", {});
  }

  document.addEventListener("DOMContentLoaded", boot);
})();
