// gantool serve: paint a hole mask on an image and inpaint it with POST /v1/inpaint.
//
// The mask lives on an offscreen canvas at the image's native resolution (white =
// hole on transparent); the visible canvas only shows a scaled copy, so a 4000 x
// 3000 photo stays responsive. Undo/redo keep the drawing operations, not pixel
// snapshots, and replay them. The mask is sent as a PNG blob, the image as the
// file that was opened (or the last result).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const view = $("view");
  const viewCtx = view.getContext("2d");
  const overlay = document.createElement("canvas"); // the tinted mask at display size
  const overlayCtx = overlay.getContext("2d");
  const mask = document.createElement("canvas"); // full resolution, never shown directly
  const maskCtx = mask.getContext("2d");

  const state = {
    image: null, // {bitmap, blob, name, width, height}
    before: null, // the image before the last inpaint, for the compare slider
    resultUrl: null,
    ops: [], // drawing operations since the image was opened
    redo: [],
    current: null, // the operation being drawn
    tool: "brush",
    busy: false,
    generation: 0, // bumps when another image is opened; stale answers are dropped
    pointer: null, // last pointer position in image pixels, for the brush outline
    apiKey: sessionStorage.getItem("gantool-api-key") || "",
  };

  // ------------------------------------------------------------------ messages

  function showMessage(text, kind = "error") {
    const box = $("message");
    box.textContent = text;
    box.className = kind;
    box.hidden = !text;
  }

  function authHeaders() {
    return state.apiKey ? { Authorization: `Bearer ${state.apiKey}` } : {};
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error) return body.error;
    } catch (e) {
      /* not JSON: fall through */
    }
    return response.statusText || "request failed";
  }

  async function loadModelInfo() {
    const info = $("model-info");
    try {
      const response = await fetch("/v1/model", { headers: authHeaders() });
      if (response.status === 401) {
        $("key-box").hidden = false;
        info.textContent = "this server needs an API key";
        return;
      }
      if (!response.ok) throw new Error(await errorText(response));
      const model = await response.json();
      info.textContent = `model ${model.model} · ${model.backend} (${model.precision}) · provider ${model.provider}`;
      info.title = model.provider_note || "";
      $("strategy").value = model.default_strategy || "auto";
    } catch (e) {
      info.textContent = `model info unavailable: ${e.message}`;
    }
  }

  // ------------------------------------------------------------------ layout and drawing

  function layout() {
    if (!state.image) return;
    const stage = $("stage");
    const scale = Math.min(
      (stage.clientWidth - 16) / state.image.width,
      (stage.clientHeight - 16) / state.image.height,
    );
    const cssWidth = Math.max(1, Math.floor(state.image.width * scale));
    const cssHeight = Math.max(1, Math.floor(state.image.height * scale));
    const dpr = window.devicePixelRatio || 1;
    view.style.width = `${cssWidth}px`;
    view.style.height = `${cssHeight}px`;
    view.width = overlay.width = Math.round(cssWidth * dpr);
    view.height = overlay.height = Math.round(cssHeight * dpr);
    scheduleRender();
  }

  let renderPending = false;
  function scheduleRender() {
    if (!renderPending) {
      renderPending = true;
      requestAnimationFrame(render);
    }
  }

  function render() {
    renderPending = false;
    if (!state.image) return;
    const w = view.width;
    const h = view.height;
    viewCtx.clearRect(0, 0, w, h);
    viewCtx.imageSmoothingQuality = "high";
    viewCtx.drawImage(state.image.bitmap, 0, 0, w, h);
    const split = Number($("compare").value) / 100;
    if (state.before && split > 0) {
      // The left part shows the image before the last inpaint.
      const sw = state.before.width * split;
      viewCtx.drawImage(state.before.bitmap, 0, 0, sw, state.before.height, 0, 0, w * split, h);
      viewCtx.fillStyle = "#fff";
      viewCtx.fillRect(Math.round(w * split) - 1, 0, 2, h);
    }
    overlayCtx.globalCompositeOperation = "source-over";
    overlayCtx.clearRect(0, 0, w, h);
    overlayCtx.drawImage(mask, 0, 0, w, h);
    overlayCtx.globalCompositeOperation = "source-in";
    overlayCtx.fillStyle = "rgb(255, 40, 90)";
    overlayCtx.fillRect(0, 0, w, h);
    viewCtx.globalAlpha = 0.55;
    viewCtx.drawImage(overlay, 0, 0);
    viewCtx.globalAlpha = 1;
    const sx = w / state.image.width;
    const sy = h / state.image.height;
    if (state.current && state.current.tool === "rect") {
      const r = rectOf(state.current);
      viewCtx.strokeStyle = "#fff";
      viewCtx.setLineDash([6, 4]);
      viewCtx.strokeRect(r.x * sx, r.y * sy, r.w * sx, r.h * sy);
      viewCtx.setLineDash([]);
    } else if (state.pointer && state.tool !== "rect") {
      viewCtx.strokeStyle = "rgba(255, 255, 255, 0.8)";
      viewCtx.beginPath();
      viewCtx.arc(state.pointer.x * sx, state.pointer.y * sy, (brushSize() * sx) / 2, 0, 2 * Math.PI);
      viewCtx.stroke();
    }
  }

  // The slider is in screen pixels; the mask is drawn in image pixels.
  function brushSize() {
    const rect = view.getBoundingClientRect();
    const perCssPixel = state.image && rect.width ? state.image.width / rect.width : 1;
    return Number($("size").value) * perCssPixel;
  }

  function toImage(event) {
    const rect = view.getBoundingClientRect();
    return {
      x: ((event.clientX - rect.left) * state.image.width) / rect.width,
      y: ((event.clientY - rect.top) * state.image.height) / rect.height,
    };
  }

  function rectOf(op) {
    const [a, b] = [op.points[0], op.points[op.points.length - 1]];
    return { x: Math.min(a.x, b.x), y: Math.min(a.y, b.y), w: Math.abs(b.x - a.x), h: Math.abs(b.y - a.y) };
  }

  function setComposite(op) {
    maskCtx.globalCompositeOperation = op.tool === "eraser" ? "destination-out" : "source-over";
    maskCtx.fillStyle = maskCtx.strokeStyle = "#fff";
    maskCtx.lineWidth = op.size;
    maskCtx.lineCap = maskCtx.lineJoin = "round";
  }

  // Draw the segment of a stroke from point index `from` to its end (from = 0: all of it).
  function drawOp(op, from = 0) {
    if (op.tool === "clear") {
      maskCtx.clearRect(0, 0, mask.width, mask.height);
      return;
    }
    setComposite(op);
    if (op.tool === "rect") {
      const r = rectOf(op);
      maskCtx.fillRect(r.x, r.y, r.w, r.h);
      return;
    }
    const points = op.points;
    if (points.length === 1 || from === 0) {
      maskCtx.beginPath();
      maskCtx.arc(points[0].x, points[0].y, op.size / 2, 0, 2 * Math.PI);
      maskCtx.fill();
    }
    if (points.length > 1) {
      maskCtx.beginPath();
      const start = Math.max(0, from - 1);
      maskCtx.moveTo(points[start].x, points[start].y);
      for (let i = start + 1; i < points.length; i++) maskCtx.lineTo(points[i].x, points[i].y);
      maskCtx.stroke();
    }
  }

  function replay() {
    maskCtx.globalCompositeOperation = "source-over";
    maskCtx.clearRect(0, 0, mask.width, mask.height);
    for (const op of state.ops) drawOp(op);
    scheduleRender();
  }

  function maskHasHoles() {
    // Painted since the last clear? (Erasing everything again is left to the server.)
    for (let i = state.ops.length - 1; i >= 0; i--) {
      if (state.ops[i].tool === "clear") return false;
      if (state.ops[i].tool !== "eraser") return true;
    }
    return false;
  }

  function updateButtons() {
    const has = Boolean(state.image);
    $("undo").disabled = !has || state.ops.length === 0;
    $("redo").disabled = !has || state.redo.length === 0;
    $("clear").disabled = !has || state.ops.length === 0;
    $("inpaint").disabled = !has || state.busy;
    $("compare").disabled = !state.before;
    const download = $("download");
    download.classList.toggle("disabled", !state.resultUrl);
    download.setAttribute("aria-disabled", String(!state.resultUrl));
    if (state.resultUrl) download.href = state.resultUrl;
    else download.removeAttribute("href");
    const size = has ? `${state.image.width}×${state.image.height}` : "";
    const rect = view.getBoundingClientRect();
    const zoom = has && rect.width ? Math.round((100 * rect.width) / state.image.width) : 0;
    $("status").textContent = has
      ? `${state.image.name} · ${size} px (mask at full resolution) · shown at ${zoom}%`
      : "no image";
  }

  function pushOp(op) {
    state.ops.push(op);
    state.redo = [];
    updateButtons();
  }

  function undo() {
    if (!state.ops.length) return;
    state.redo.push(state.ops.pop());
    replay();
    updateButtons();
  }

  function redo() {
    if (!state.redo.length) return;
    const op = state.redo.pop();
    state.ops.push(op);
    drawOp(op);
    scheduleRender();
    updateButtons();
  }

  function clearMask() {
    if (!state.ops.length) return;
    const op = { tool: "clear", points: [], size: 0 };
    pushOp(op);
    drawOp(op);
    scheduleRender();
  }

  // ------------------------------------------------------------------ opening images

  async function openImage(blob, name, keepBefore = null) {
    let bitmap;
    try {
      bitmap = await createImageBitmap(blob); // decoded off the main thread, EXIF orientation applied
    } catch (e) {
      showMessage(`cannot open ${name}: not an image this browser can decode`);
      return;
    }
    state.generation += 1;
    state.image = { bitmap, blob, name, width: bitmap.width, height: bitmap.height };
    state.before = keepBefore;
    if (!keepBefore) {
      if (state.resultUrl) URL.revokeObjectURL(state.resultUrl);
      state.resultUrl = null;
      $("compare").value = 0;
    }
    mask.width = bitmap.width; // resizing also clears it
    mask.height = bitmap.height;
    state.ops = [];
    state.redo = [];
    state.current = null;
    view.classList.add("shown");
    $("placeholder").hidden = true;
    layout();
    updateButtons();
  }

  function openFile(file) {
    if (!file) return;
    showMessage("");
    openImage(file, file.name || "pasted image");
  }

  // ------------------------------------------------------------------ inpainting

  function stemOf(name) {
    return name.replace(/\.[^.]+$/, "").replace(/\.inpainted$/, "") || "image";
  }

  async function inpaint() {
    if (!state.image || state.busy) return;
    if (!maskHasHoles()) {
      showMessage("Paint the holes first (brush or rectangle).", "info");
      return;
    }
    state.busy = true;
    $("spinner").hidden = false;
    $("inpaint").setAttribute("aria-busy", "true");
    updateButtons();
    showMessage("");
    const generation = state.generation;
    const image = state.image;
    try {
      const maskBlob = await new Promise((resolve, reject) =>
        mask.toBlob((b) => (b ? resolve(b) : reject(new Error("could not encode the mask"))), "image/png"),
      );
      const form = new FormData();
      form.append("image", image.blob, image.name);
      form.append("mask", maskBlob, "mask.png");
      form.append("strategy", $("strategy").value);
      form.append("format", "png");
      const response = await fetch("/v1/inpaint", { method: "POST", body: form, headers: authHeaders() });
      if (!response.ok) {
        if (response.status === 401) $("key-box").hidden = false;
        const id = response.headers.get("X-Request-ID");
        const said = await errorText(response);
        showMessage(`Inpainting failed (HTTP ${response.status}${id ? `, request ${id}` : ""}): ${said}`);
        return;
      }
      const holes = Number(response.headers.get("X-Gantool-Holes"));
      const result = await response.blob();
      if (generation !== state.generation) return; // another image was opened meanwhile
      const name = `${stemOf(image.name)}.inpainted.png`;
      if (state.resultUrl) URL.revokeObjectURL(state.resultUrl);
      state.resultUrl = URL.createObjectURL(result);
      $("download").download = name;
      await openImage(result, name, image); // inpaint again on the result; compare with `image`
      $("compare").value = 0;
      if (holes === 0) {
        showMessage("No hole was found in the mask: the image came back unchanged.", "info");
      } else {
        const filled = Number.isFinite(holes) && holes > 0 ? `${holes} hole${holes === 1 ? "" : "s"} filled. ` : "";
        showMessage(`Done: ${filled}Drag Compare to see the image before, or paint again to inpaint the result.`, "info");
      }
    } catch (e) {
      showMessage(`Inpainting failed: ${e.message}`);
    } finally {
      state.busy = false;
      $("spinner").hidden = true;
      $("inpaint").removeAttribute("aria-busy");
      updateButtons();
    }
  }

  // ------------------------------------------------------------------ events

  view.addEventListener("pointerdown", (event) => {
    if (!state.image || event.button !== 0) return;
    view.setPointerCapture(event.pointerId);
    const point = toImage(event);
    state.current = { tool: state.tool, size: brushSize(), points: [point] };
    if (state.tool !== "rect") drawOp(state.current);
    scheduleRender();
  });

  view.addEventListener("pointermove", (event) => {
    if (!state.image) return;
    state.pointer = toImage(event);
    const op = state.current;
    if (op) {
      const events = event.getCoalescedEvents ? event.getCoalescedEvents() : [event];
      const from = op.points.length;
      for (const e of events.length ? events : [event]) op.points.push(toImage(e));
      if (op.tool !== "rect") drawOp(op, from);
    }
    scheduleRender();
  });

  function endStroke(event) {
    const op = state.current;
    if (!op) return;
    state.current = null;
    if (event.type === "pointerup") op.points.push(toImage(event));
    if (op.tool === "rect") {
      const r = rectOf(op);
      if (r.w < 1 || r.h < 1) {
        scheduleRender();
        return;
      }
      drawOp(op);
    }
    pushOp(op);
    scheduleRender();
  }

  view.addEventListener("pointerup", endStroke);
  view.addEventListener("pointercancel", endStroke);
  view.addEventListener("pointerleave", () => {
    state.pointer = null;
    scheduleRender();
  });

  for (const button of document.querySelectorAll("button.tool")) {
    button.addEventListener("click", () => selectTool(button.dataset.tool));
  }

  function selectTool(tool) {
    state.tool = tool;
    for (const b of document.querySelectorAll("button.tool")) b.classList.toggle("active", b.dataset.tool === tool);
  }

  $("size").addEventListener("input", () => {
    $("size-value").textContent = $("size").value;
    scheduleRender();
  });
  $("compare").addEventListener("input", scheduleRender);
  $("undo").addEventListener("click", undo);
  $("redo").addEventListener("click", redo);
  $("clear").addEventListener("click", clearMask);
  $("inpaint").addEventListener("click", inpaint);
  $("file").addEventListener("change", (event) => {
    openFile(event.target.files[0]);
    event.target.value = ""; // the same file can be opened again
  });
  $("api-key").value = state.apiKey;
  $("api-key").addEventListener("change", (event) => {
    state.apiKey = event.target.value.trim();
    sessionStorage.setItem("gantool-api-key", state.apiKey);
    loadModelInfo();
  });

  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement && event.target.type !== "range") return;
    const key = event.key.toLowerCase();
    if ((event.ctrlKey || event.metaKey) && key === "z") {
      event.preventDefault();
      if (event.shiftKey) redo();
      else undo();
    } else if ((event.ctrlKey || event.metaKey) && key === "y") {
      event.preventDefault();
      redo();
    } else if (!event.ctrlKey && !event.metaKey && !event.altKey) {
      const tool = { b: "brush", e: "eraser", r: "rect" }[key];
      if (tool) selectTool(tool);
    }
  });

  document.addEventListener("paste", (event) => {
    const items = event.clipboardData ? Array.from(event.clipboardData.items) : [];
    const item = items.find((i) => i.kind === "file" && i.type.startsWith("image/"));
    if (item) {
      event.preventDefault();
      openFile(item.getAsFile());
    }
  });

  const stage = $("stage");
  stage.addEventListener("dragover", (event) => {
    event.preventDefault();
    stage.classList.add("dragging");
  });
  stage.addEventListener("dragleave", () => stage.classList.remove("dragging"));
  stage.addEventListener("drop", (event) => {
    event.preventDefault();
    stage.classList.remove("dragging");
    const file = event.dataTransfer && event.dataTransfer.files[0];
    if (file) openFile(file);
  });

  // The stage changes size with the window and when a message shows or hides.
  new ResizeObserver(() => {
    layout();
    updateButtons();
  }).observe(stage);

  loadModelInfo();
  updateButtons();
})();
