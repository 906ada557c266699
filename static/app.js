// Moonji's own script, loaded by every page with `defer`: copy buttons,
// confirmations, and the chat's composer (Send that turns into Stop, keys,
// the count of chunks shown that Stop sends as `seen`). Streaming itself is
// htmx-ext-sse's: each reply follows its events, chunks appended in order.
'use strict';

// --- Copy -----------------------------------------------------------------
// A button with data-copy="selector" copies the value or text of that
// element; a code block's "Copy" button (class copy, from the Markdown
// renderer) copies its code.
document.addEventListener('click', async (event) => {
  const button = event.target.closest('[data-copy], .code button.copy');
  if (!button) return;
  const source = button.dataset.copy
    ? document.querySelector(button.dataset.copy)
    : button.closest('.code')?.querySelector('pre');
  if (!source) return;
  const text = 'value' in source ? source.value : source.innerText;
  let copied = false;
  try {
    // A browser that asks the person for permission may never settle the
    // promise: do not wait forever, fall back instead.
    await Promise.race([
      navigator.clipboard.writeText(text),
      new Promise((_, reject) => setTimeout(() => reject(new Error('clipboard timeout')), 1000)),
    ]);
    copied = true;
  } catch {
    // No clipboard API (plain http on another host than localhost), or no
    // permission: select the text and try the old command; Ctrl+C still works.
    if (source.select) source.select();
    else window.getSelection()?.selectAllChildren(source);
    try { copied = document.execCommand('copy'); } catch { copied = false; }
  }
  const label = button.dataset.label || button.textContent;
  button.dataset.label = label;
  button.textContent = copied ? 'Copied' : 'Press Ctrl+C';
  setTimeout(() => { button.textContent = label; }, 2000);
});

// --- Confirmations --------------------------------------------------------
// A form with data-confirm asks before it is sent (deleting a conversation).
document.addEventListener('submit', (event) => {
  const form = event.target;
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
    event.stopImmediatePropagation();
  }
}, true);

// --- Sidebar on a phone ---------------------------------------------------
document.addEventListener('click', (event) => {
  const toggle = event.target.closest('.sidebar-toggle');
  if (!toggle) return;
  const open = document.body.classList.toggle('sidebar-open');
  toggle.setAttribute('aria-expanded', String(open));
});

// --- Sidebar: pins and folders ---------------------------------------------
// Each conversation has a menu (Pin or Unpin, Move to folder) whose forms
// htmx posts; the answer is the sidebar again, and the focus goes back to
// the control that was used. A conversation dragged onto a folder, onto
// "Pinned" or onto "No folder" is moved there through the API.
let sidebarFocus = null;

document.addEventListener('htmx:beforeRequest', (event) => {
  const sidebar = document.getElementById('sidebar');
  if (sidebar && sidebar.contains(event.detail.elt)) sidebarFocus = document.activeElement?.id || null;
});

document.addEventListener('htmx:oobAfterSwap', (event) => {
  if (event.target.id !== 'sidebar' || !sidebarFocus) return;
  const el = document.getElementById(sidebarFocus);
  sidebarFocus = null;
  if (!el) return;
  const menu = el.closest('details');
  if (menu) menu.open = true;
  el.focus();
});

// One menu open at a time; Escape or a click elsewhere closes it.
document.addEventListener('toggle', (event) => {
  const menu = event.target;
  if (!menu.classList?.contains('conv-menu') || !menu.open) return;
  document.querySelectorAll('details.conv-menu[open]').forEach((other) => { if (other !== menu) other.open = false; });
  // The sidebar scrolls (on a phone it is a short drawer): show the menu whole.
  menu.querySelector('.conv-menu-body')?.scrollIntoView({ block: 'nearest' });
}, true);
document.addEventListener('keydown', (event) => {
  const menu = event.target.closest?.('details.conv-menu[open]');
  if (event.key !== 'Escape' || !menu) return;
  // Only the menu: an answer streaming meanwhile goes on (Esc stops it elsewhere).
  event.preventDefault();
  event.stopImmediatePropagation();
  menu.open = false;
  menu.querySelector('summary')?.focus();
});
document.addEventListener('click', (event) => {
  document.querySelectorAll('details.conv-menu[open]').forEach((menu) => {
    if (!menu.contains(event.target)) menu.open = false;
  });
});

const dragType = 'application/x-moonji-conversation';
const dropZone = (event) => event.target.closest?.('#sidebar [data-drop-folder], #sidebar [data-drop-pin]') || null;
const clearDropZones = () => document.querySelectorAll('#sidebar .drop-target').forEach((z) => z.classList.remove('drop-target'));

document.addEventListener('dragstart', (event) => {
  const item = event.target.closest?.('#sidebar [data-conversation]');
  if (!item) return;
  event.dataTransfer.setData(dragType, item.dataset.conversation);
  event.dataTransfer.effectAllowed = 'move';
});
document.addEventListener('dragover', (event) => {
  const zone = dropZone(event);
  if (!zone || !event.dataTransfer.types.includes(dragType)) return;
  event.preventDefault();
  event.dataTransfer.dropEffect = 'move';
  if (!zone.classList.contains('drop-target')) {
    clearDropZones();
    zone.classList.add('drop-target');
  }
});
document.addEventListener('dragleave', (event) => {
  const zone = dropZone(event);
  if (zone && !zone.contains(event.relatedTarget)) zone.classList.remove('drop-target');
});
document.addEventListener('dragend', clearDropZones);
document.addEventListener('drop', async (event) => {
  const zone = dropZone(event);
  const id = zone && event.dataTransfer.getData(dragType);
  if (!id) return;
  event.preventDefault();
  clearDropZones();
  const change = 'dropPin' in zone.dataset ? { pinned: true } : { folder: zone.dataset.dropFolder };
  try {
    const resp = await fetch(`/api/v1/conversations/${encodeURIComponent(id)}`, {
      method: 'PATCH',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrfToken() },
      body: JSON.stringify(change),
    });
    if (!resp.ok) {
      let message = `Moving the conversation failed (HTTP ${resp.status}).`;
      try { message = (await resp.json()).error?.message || message; } catch { /* not JSON */ }
      showError(message);
    }
  } catch {
    showError('The server could not be reached. Check the connection and try again.');
  }
  const current = document.getElementById('sidebar')?.dataset.current || '';
  htmx.ajax('GET', `/sidebar?current=${encodeURIComponent(current)}`, { target: '#sidebar', swap: 'none' });
});

// --- The chat -------------------------------------------------------------
const thread = () => document.getElementById('thread');
const sendButton = () => document.getElementById('send');
const composerError = () => document.getElementById('composer-error');

function csrfToken() {
  try {
    return JSON.parse(document.body.getAttribute('hx-headers') || '{}')['X-CSRF-Token'] || '';
  } catch {
    return '';
  }
}

// streamingReply is the reply being written in this conversation, if any
// (one at a time per conversation).
function streamingReply() {
  return thread()?.querySelector('article[data-role="assistant"][data-status="streaming"]') || null;
}

function showError(text) {
  const el = composerError();
  if (!el) return;
  el.textContent = text;
  el.hidden = !text;
}

// sync makes the page agree with its messages: Send or Stop, and no
// Regenerate, Edit, Delete or version switch while an answer streams (one
// answer at a time per conversation).
function sync() {
  const button = sendButton();
  if (!button) return;
  const streaming = streamingReply();
  button.textContent = streaming ? 'Stop' : 'Send';
  button.type = streaming ? 'button' : 'submit';
  button.classList.toggle('stop', !!streaming);
  button.disabled = !!streaming?.dataset.stopping;
  thread()?.querySelectorAll('.regenerate, .edit, .delete, .versions').forEach((b) => { b.hidden = !!streaming; });
}

// finishReply shows a reply as ended once its done event replaced its
// answer: its status, its buttons.
function finishReply(article) {
  const answer = article.querySelector('.answer');
  const status = answer?.dataset.status || 'done';
  article.dataset.status = status;
  article.removeAttribute('aria-busy');
  delete article.dataset.stopping;
  const actions = article.querySelector('.actions');
  if (actions) actions.hidden = false;
  const note = article.querySelector('[data-note]');
  if (note) note.textContent = status === 'stopped' ? 'Stopped' : status === 'error' ? 'Failed' : '';
  const regenerate = article.querySelector('.regenerate');
  if (regenerate) regenerate.textContent = status === 'error' ? 'Retry' : 'Regenerate';
  sync();
}

// stop stops the streaming reply. From this moment no chunk is applied,
// and the server is told how many were: the saved answer is exactly the
// text on the screen. A reply followed by reloading (it runs on another
// replica) has no count; it keeps what was written when the stop landed.
async function stop() {
  const article = streamingReply();
  if (!article || article.dataset.stopping) return;
  article.dataset.stopping = '1';
  sync();
  const body = { inference_id: article.dataset.inference };
  if (article.dataset.seen !== undefined) body.seen = Number(article.dataset.seen);
  try {
    const resp = await fetch('/api/v1/inference/stop', {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrfToken() },
      body: JSON.stringify(body),
    });
    if (!resp.ok) {
      let message = `Stopping failed (HTTP ${resp.status}).`;
      try { message = (await resp.json()).error?.message || message; } catch { /* not JSON */ }
      throw new Error(message);
    }
  } catch (err) {
    showError(err.message || 'Stopping failed.');
    // Chunks held back meanwhile are not on the screen: draw the reply
    // again from the server rather than show a gap.
    delete article.dataset.stopping;
    const conversation = document.getElementById('conversation')?.value;
    if (conversation && article.id.startsWith('m-')) {
      htmx.ajax('GET', `/c/${conversation}/m/${article.id.slice(2)}`, { target: article, swap: 'outerHTML' });
    }
    sync();
  }
}

function nearBottom(el) {
  return el.scrollHeight - el.scrollTop - el.clientHeight < 80;
}

let followBottom = true;

document.addEventListener('htmx:sseBeforeMessage', (event) => {
  const article = event.target.closest('article');
  if (!article) return;
  const type = event.detail.type;
  const t = thread();
  followBottom = t ? nearBottom(t) : false;
  if (type === 'chunk') {
    // After Stop nothing more is shown; a chunk already shown (a
    // reconnection replays from the page's first seq) is not shown twice.
    const seq = Number(event.detail.lastEventId);
    if (article.dataset.stopping || seq <= Number(article.dataset.seen || 0)) {
      event.preventDefault();
    }
  } else if (type === 'done') {
    // htmx swaps the answer for the final HTML right after this event.
    setTimeout(() => {
      finishReply(article);
      if (followBottom && t) t.scrollTop = t.scrollHeight;
    }, 0);
  }
});

document.addEventListener('htmx:sseMessage', (event) => {
  if (event.detail.type !== 'chunk') return;
  const article = event.target.closest('article');
  if (article) article.dataset.seen = event.detail.lastEventId;
  const t = thread();
  if (followBottom && t) t.scrollTop = t.scrollHeight;
});

document.addEventListener('click', (event) => {
  const button = event.target.closest('#send');
  if (button && button.type === 'button') {
    event.preventDefault();
    stop();
  }
});

// Editing a message: Esc cancels, Ctrl+Enter (⌘+Enter) sends; Enter
// alone is a new line, as an edit is often longer.
document.addEventListener('keydown', (event) => {
  const form = event.target.closest?.('.edit-form');
  if (!form) return;
  if (event.key === 'Escape') {
    event.preventDefault();
    event.stopImmediatePropagation();
    form.querySelector('button[type="button"]')?.click();
  } else if (event.key === 'Enter' && (event.ctrlKey || event.metaKey) && !event.isComposing) {
    event.preventDefault();
    form.requestSubmit();
  }
}, true);

document.addEventListener('keydown', (event) => {
  if (event.key === 'Escape' && streamingReply()) {
    event.preventDefault();
    stop();
    return;
  }
  const box = event.target;
  if (box.id !== 'message' || event.key !== 'Enter' || event.shiftKey || event.isComposing) return;
  // Enter sends; Shift+Enter is a new line; Enter that ends an IME
  // composition (Korean, Japanese) only ends the composition.
  event.preventDefault();
  if (!streamingReply() && (box.value.trim() !== '' || attachedCount() > 0)) box.form.requestSubmit();
});

// The message box grows with its text, up to a point.
document.addEventListener('input', (event) => {
  const box = event.target;
  if (box.id !== 'message') return;
  box.style.height = 'auto';
  box.style.height = `${Math.min(box.scrollHeight, 240)}px`;
});

document.addEventListener('htmx:afterRequest', (event) => {
  const form = event.detail.elt;
  if (form?.id !== 'composer' || !event.detail.successful) return;
  // A refused send is answered into the error line: keep the text then.
  if (event.detail.xhr.getResponseHeader('HX-Retarget')) return;
  const box = document.getElementById('message');
  box.value = '';
  box.style.height = '';
  box.focus();
  const t = thread();
  if (t) t.scrollTop = t.scrollHeight;
});

document.addEventListener('htmx:responseError', (event) => {
  showError(`The request failed (HTTP ${event.detail.xhr.status}). Reload the page and try again.`);
});
document.addEventListener('htmx:sendError', () => {
  showError('The server could not be reached. Check the connection and try again.');
});

document.addEventListener('htmx:afterSettle', sync);
document.addEventListener('DOMContentLoaded', () => {
  sync();
  const t = thread();
  if (t) t.scrollTop = t.scrollHeight;
});

// --- Attachments ----------------------------------------------------------
// Files attached to the next message: by the Attach button, dropped on the
// composer, or pasted into the message box. Each is uploaded at once
// (POST /api/v1/attachments) and shown as a preview with its id in a
// hidden attachment_ids field of the composer, which the send carries.
// A refused file is said next to the composer; nothing typed is lost.
const attachBox = () => document.getElementById('attach');
const previews = () => document.getElementById('attachments');
const imageTypes = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];

function attachedCount() {
  return previews()?.children.length || 0;
}

function modelSeesImages() {
  const box = attachBox();
  const model = document.getElementById('model')?.value || '';
  return !!box && box.dataset.vision.split(' ').includes(model);
}

// syncAttach keeps the Attach button in step with the chosen model: for a
// model that cannot see images it is disabled, says why, and a button for
// text files takes its place.
function syncAttach() {
  const box = attachBox();
  if (!box) return;
  const button = document.getElementById('attach-button');
  const text = document.getElementById('attach-text');
  const why = document.getElementById('attach-why');
  const sees = modelSeesImages();
  const reason = sees ? '' : `${document.getElementById('model')?.value} cannot see images. Choose a model with vision to attach images; text files can still be attached.`;
  button.disabled = !sees;
  if (sees) button.removeAttribute('title'); else button.title = reason;
  why.textContent = reason;
  why.hidden = sees;
  text.hidden = sees;
  const message = document.getElementById('message');
  if (message) message.required = attachedCount() === 0;
  previews().hidden = attachedCount() === 0;
}

function formatSize(n) {
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MB`;
  if (n >= 1 << 10) return `${Math.ceil(n / 1024)} KB`;
  return `${n} bytes`;
}

// refusal says why file cannot be attached before it is sent, or ''.
function refusal(file) {
  const box = attachBox();
  const isImage = imageTypes.includes(file.type);
  if (attachedCount() >= Number(box.dataset.maxFiles)) {
    return `A message may carry at most ${box.dataset.maxFiles} files.`;
  }
  if (isImage && !modelSeesImages()) {
    return `${document.getElementById('model').value} cannot see images: choose a model with vision to attach "${file.name}".`;
  }
  const limit = Number(isImage ? box.dataset.maxBytes : box.dataset.maxText);
  if (file.size > limit) {
    return `"${file.name}" is ${formatSize(file.size)}; ${isImage ? 'an image' : 'a text file'} may be at most ${formatSize(limit)}.`;
  }
  return '';
}

// preview shows a file being uploaded: its name, then (once stored) an
// image's thumbnail, served back like a sent one (the page's CSP allows
// no blob: images).
function preview(file) {
  const li = document.createElement('li');
  li.dataset.uploading = '1';
  const chip = document.createElement('span');
  chip.className = 'file-chip';
  chip.textContent = file.name;
  li.append(chip);
  const state = document.createElement('span');
  state.className = 'upload-state muted';
  state.textContent = 'Uploading…';
  const remove = document.createElement('button');
  remove.type = 'button';
  remove.className = 'ghost remove';
  remove.textContent = 'Remove';
  remove.setAttribute('aria-label', `Remove ${file.name}`);
  li.append(state, remove);
  return li;
}

function dropPreview(li) {
  li.remove();
  syncAttach();
}

async function attachFiles(files) {
  if (!attachBox()) return;
  for (const file of files) {
    const why = refusal(file);
    if (why) {
      showError(why);
      continue;
    }
    const li = preview(file);
    previews().append(li);
    syncAttach();
    const form = new FormData();
    form.append('file', file, file.name || 'pasted.png');
    try {
      const resp = await fetch('/api/v1/attachments', {
        method: 'POST', credentials: 'same-origin', headers: { 'X-CSRF-Token': csrfToken() }, body: form,
      });
      let body = {};
      try { body = await resp.json(); } catch { /* not JSON */ }
      if (resp.status !== 201) throw new Error(body.error?.message || `The upload failed (HTTP ${resp.status}).`);
      const field = document.createElement('input');
      field.type = 'hidden';
      field.name = 'attachment_ids';
      field.value = body.id;
      li.append(field);
      li.dataset.id = body.id;
      delete li.dataset.uploading;
      if (body.kind === 'image') {
        const img = document.createElement('img');
        img.src = `/api/v1/attachments/${encodeURIComponent(body.id)}`;
        img.alt = '';
        li.prepend(img);
      }
      li.querySelector('.upload-state').textContent = formatSize(body.bytes);
    } catch (err) {
      dropPreview(li);
      showError(err.message || 'The upload failed.');
    }
  }
}

document.addEventListener('click', (event) => {
  const input = document.getElementById('attach-input');
  if (event.target.closest('#attach-button, #attach-text') && input) {
    // The text-file button offers text files only.
    const all = input.dataset.accept || input.accept;
    input.dataset.accept = all;
    input.accept = event.target.closest('#attach-text') ? all.split(',').filter((a) => a.startsWith('.')).join(',') : all;
    input.click();
    return;
  }
  const remove = event.target.closest('#attachments .remove');
  if (remove) {
    dropPreview(remove.closest('li'));
    document.getElementById('message')?.focus();
  }
});

document.addEventListener('change', (event) => {
  if (event.target.id !== 'attach-input') return;
  const files = [...event.target.files];
  event.target.value = '';
  attachFiles(files);
});

document.addEventListener('change', (event) => {
  if (event.target.id === 'model') syncAttach();
});

const carriesFiles = (event) => [...(event.dataTransfer?.types || [])].includes('Files');

document.addEventListener('dragover', (event) => {
  const composer = event.target.closest?.('#composer');
  if (!composer || !carriesFiles(event)) return;
  event.preventDefault();
  composer.classList.add('dragging');
});
document.addEventListener('dragleave', (event) => {
  const composer = event.target.closest?.('#composer');
  if (composer && !composer.contains(event.relatedTarget)) composer.classList.remove('dragging');
});
document.addEventListener('drop', (event) => {
  const composer = event.target.closest?.('#composer');
  if (!composer || !carriesFiles(event)) return;
  event.preventDefault();
  composer.classList.remove('dragging');
  attachFiles([...event.dataTransfer.files]);
});

document.addEventListener('paste', (event) => {
  if (event.target.id !== 'message') return;
  const files = [...(event.clipboardData?.files || [])];
  if (files.length === 0) return;
  // A file pasted alone (a screenshot) is attached; text pasted with it
  // still goes into the box.
  if (!event.clipboardData.types.includes('text/plain')) event.preventDefault();
  attachFiles(files);
});

// A send waits for its files; once sent, the previews go.
document.addEventListener('htmx:beforeRequest', (event) => {
  if (event.detail.elt?.id !== 'composer') return;
  if (previews()?.querySelector('[data-uploading]')) {
    event.preventDefault();
    showError('Wait until the files are uploaded, then send.');
  }
});
document.addEventListener('htmx:afterRequest', (event) => {
  if (event.detail.elt?.id !== 'composer' || !event.detail.successful) return;
  if (event.detail.xhr.getResponseHeader('HX-Retarget')) return;
  for (const li of [...(previews()?.children || [])]) dropPreview(li);
});
document.addEventListener('DOMContentLoaded', syncAttach);
