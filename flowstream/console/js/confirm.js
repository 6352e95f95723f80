// The one confirmation dialog (a modal <dialog>: focus stays inside, Escape cancels).
// It opens with Cancel focused, the safe choice, and gives the focus back on closing.

/**
 * Ask before an action: resolves to {ok, reason}. ``reason``: whether to ask for one.
 */
export function confirmAction({ title, text, ok, reason = false, returnTo = null }) {
  const dialog = document.getElementById("confirm");
  const reasonInput = document.getElementById("confirm-reason");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = ok;
  reasonInput.value = "";
  reasonInput.hidden = !reason;
  document.querySelector("label[for=confirm-reason]").hidden = !reason;
  dialog.returnValue = "";
  const back = returnTo || document.activeElement;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (back && back.focus) back.focus();
      resolve({ ok: dialog.returnValue === "ok", reason: reasonInput.value.trim() });
    }, { once: true });
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}
