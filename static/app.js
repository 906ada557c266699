// Moonji's own script: the copy buttons. Loaded by every page with `defer`.
// A button with data-copy="#id" copies the value (or text) of that element.
document.addEventListener('click', async (event) => {
  const button = event.target.closest('[data-copy]');
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  if (!source) return;
  const text = 'value' in source ? source.value : source.textContent;
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
    source.select?.();
    try { copied = document.execCommand('copy'); } catch { copied = false; }
  }
  const label = button.dataset.label || button.textContent;
  button.dataset.label = label;
  button.textContent = copied ? 'Copied' : 'Press Ctrl+C';
  setTimeout(() => { button.textContent = label; }, 2000);
});
