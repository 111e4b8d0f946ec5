// Material's search runs in a web worker, and Chromium starts no worker from a page opened from the file system
// (file://). There, this runs the worker's script in a hidden iframe of the page instead: the same messages, in
// the same order, with nothing fetched from the network (Material's offline plugin would load a shim from a CDN).
if (location.protocol === "file:") {
  window.Worker = class extends EventTarget {
    constructor(url) {
      super();
      this.queue = [];
      const frame = document.createElement("iframe");
      frame.hidden = true;
      document.body.appendChild(frame);
      const scope = frame.contentWindow;
      // the worker's global postMessage answers the page, not the iframe itself
      scope.postMessage = (data) => this.dispatchEvent(new MessageEvent("message", { data }));
      scope.importScripts = (...urls) => urls.forEach((src) => this.load(scope, src));
      this.scope = scope;
      this.load(scope, url, () => {
        this.ready = true;
        this.queue.splice(0).forEach((data) => this.postMessage(data));
      });
    }
    load(scope, src, onload) {
      const script = scope.document.createElement("script");
      script.src = new URL(src, location.href).href;
      script.onload = onload || null;
      scope.document.head.appendChild(script);
    }
    postMessage(data) {
      if (!this.ready) return void this.queue.push(data);
      this.scope.dispatchEvent(new MessageEvent("message", { data }));
    }
    terminate() {}
  };
}
