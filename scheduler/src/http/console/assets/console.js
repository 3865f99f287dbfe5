// Live refresh by conditional polling: every few seconds the page asks for itself again with
// If-None-Match; an unchanged page is a 304 with no body. A changed one replaces each element
// marked data-refresh (tables, figures), never the forms an operator may be typing in, and
// never an element holding the keyboard focus. body.dataset.refreshes counts the swaps (tests
// wait on it instead of sleeping).
(() => {
  const INTERVAL_MS = 5000;
  let etag = null;
  let refreshes = 0;
  document.body.dataset.refreshes = "0";

  async function poll() {
    if (document.visibilityState !== "visible") return;
    const headers = etag ? { "If-None-Match": etag } : {};
    let response;
    try {
      response = await fetch(location.href, { headers, cache: "no-store", credentials: "same-origin" });
    } catch (e) {
      return;
    }
    if (response.status === 304 || !response.ok) return;
    etag = response.headers.get("ETag");
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    let changed = false;
    for (const el of document.querySelectorAll("[data-refresh]")) {
      const fresh = doc.getElementById(el.id);
      if (!fresh || fresh.innerHTML === el.innerHTML) continue;
      if (el.contains(document.activeElement)) continue;
      el.innerHTML = fresh.innerHTML;
      changed = true;
    }
    if (changed) document.body.dataset.refreshes = String(++refreshes);
  }

  setInterval(poll, INTERVAL_MS);
  document.addEventListener("visibilitychange", poll);
  document.body.dataset.live = "1";
})();
