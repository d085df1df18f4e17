// Keyboard, pointer-locked mouse and gamepad -> held-key set, accumulated mouse movement and axis positions.
// What each drives comes from the model's declared action space (GET /v1/model: keys, axes, bindings).

import type { AxisInfo } from "./protocol";

/** Browser key codes with names of their own; letters and digits map to themselves ("KeyQ" -> "q"). */
const NAMED_KEYS: Record<string, string> = {
  Space: "space", ShiftLeft: "shift", ShiftRight: "shift", ControlLeft: "ctrl", ControlRight: "ctrl",
  ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right",
};
/** Arrows drive W/A/S/D for a model without arrow keys of its own. */
const ARROW_ALIAS: Record<string, string> = { up: "w", left: "a", down: "s", right: "d" };

/** The model key a browser key code drives, among `allowed` (undefined: none). */
export function modelKey(code: string, allowed: Set<string>): string | undefined {
  let name = NAMED_KEYS[code];
  if (name === undefined && /^Key[A-Z]$/.test(code)) name = code.slice(3).toLowerCase();
  if (name === undefined && /^Digit[0-9]$/.test(code)) name = code.slice(5);
  if (name === undefined) return undefined;
  if (allowed.has(name)) return name;
  const alias = ARROW_ALIAS[name];
  return alias !== undefined && allowed.has(alias) ? alias : undefined;
}

function isTyping(target: EventTarget | null): boolean {
  const el = target as HTMLElement | null;
  return !!el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.isContentEditable);
}

/** Stick positions nearer the centre than this count as the centre (worn sticks rest a little off it). */
const STICK_DEADZONE = 0.15;
/** A gamepad button bound to a key holds it past this pressure (analog triggers report 0..1). */
const BUTTON_PRESS = 0.5;

/** A model's gamepad bindings (ModelInfo.actions.bindings) read from the Gamepad API's standard mapping
 * (https://w3c.github.io/gamepad/#remapping). The API has no events for sticks: `poll` reads the pads. */
export class GamepadInput {
  private axisOf = new Map<number, AxisInfo>(); // gamepad axis index -> model axis
  private buttonAxis = new Map<number, AxisInfo>(); // gamepad button index -> model axis (analog triggers)
  private buttonKey = new Map<number, string>(); // gamepad button index -> model key
  /** Whether the model binds any gamepad input. */
  bound = false;

  configure(axes: AxisInfo[], keys: string[], bindings: Record<string, string>): void {
    this.axisOf.clear();
    this.buttonAxis.clear();
    this.buttonKey.clear();
    const byName = new Map(axes.map((a) => [a.name, a]));
    for (const [input, control] of Object.entries(bindings)) {
      const m = /^gamepad\.(axis|button)\.(\d+)$/.exec(input);
      if (!m) continue;
      const i = Number(m[2]);
      const ax = byName.get(control);
      if (m[1] === "axis" && ax?.kind === "absolute") this.axisOf.set(i, ax);
      else if (m[1] === "button" && ax?.kind === "absolute") this.buttonAxis.set(i, ax);
      else if (m[1] === "button" && keys.includes(control)) this.buttonKey.set(i, control);
    }
    this.bound = this.axisOf.size + this.buttonAxis.size + this.buttonKey.size > 0;
  }

  /** Keys held and absolute axes off their rest position on the connected pads now. */
  poll(): { keys: Set<string>; axes: Record<string, number> } {
    const keys = new Set<string>();
    const axes: Record<string, number> = {};
    if (!this.bound || typeof navigator.getGamepads !== "function") return { keys, axes };
    const clamp = (a: AxisInfo, v: number) => Math.min(a.range[1], Math.max(a.range[0], v));
    for (const pad of navigator.getGamepads()) {
      if (!pad || !pad.connected) continue;
      for (const [i, ax] of this.axisOf) {
        const v = pad.axes[i] ?? 0;
        if (Math.abs(v) > STICK_DEADZONE && v !== ax.rest) axes[ax.name] = clamp(ax, v);
      }
      for (const [i, ax] of this.buttonAxis) {
        const v = pad.buttons[i]?.value ?? 0;
        if (v > 0 && v !== ax.rest) axes[ax.name] = clamp(ax, v);
      }
      for (const [i, key] of this.buttonKey) {
        const b = pad.buttons[i];
        if (b && (b.pressed || b.value > BUTTON_PRESS)) keys.add(key);
      }
    }
    return { keys, axes };
  }
}

export class InputState {
  /** Model key names this session accepts (ModelInfo.actions.keys); others are never sent. */
  allowed = new Set<string>(["w", "a", "s", "d", "space", "shift"]);
  /** Whether the model reads the mouse (ModelInfo.actions.mouse non-empty): pointer lock only then. */
  mouse = true;
  /** Called on every key down/up that changes the held set. */
  onChange: () => void = () => {};
  private held = new Map<string, Set<string>>(); // model key -> browser codes holding it
  private dx = 0;
  private dy = 0;

  constructor(private readonly mouseTarget: HTMLElement, private readonly enabled: () => boolean) {
    window.addEventListener("keydown", (e) => this.key(e, true));
    window.addEventListener("keyup", (e) => this.key(e, false));
    window.addEventListener("blur", () => this.releaseAll());
    mouseTarget.addEventListener("click", () => {
      if (!this.enabled() || !this.mouse || document.pointerLockElement === mouseTarget) return;
      // Returns a promise in current Chromium (rejects if the user exits lock too quickly).
      const p = mouseTarget.requestPointerLock() as Promise<void> | undefined;
      p?.catch(() => {});
    });
    document.addEventListener("mousemove", (e) => {
      if (document.pointerLockElement === mouseTarget) {
        this.dx += e.movementX;
        this.dy += e.movementY;
      }
    });
  }

  private key(e: KeyboardEvent, down: boolean): void {
    const name = modelKey(e.code, this.allowed);
    if (!name || !this.enabled()) return;
    // Typing in the prompt box or a browser shortcut is not steering; releases always count.
    if (down && (isTyping(e.target) || e.ctrlKey || e.metaKey || e.altKey)) return;
    e.preventDefault(); // no page scrolling on space/arrows, no button activation on space
    const codes = this.held.get(name) ?? new Set<string>();
    const before = codes.size > 0;
    if (down) codes.add(e.code);
    else codes.delete(e.code);
    this.held.set(name, codes);
    if (before !== codes.size > 0) this.onChange();
  }

  /** Release every key (window lost focus, or disconnect). */
  releaseAll(): void {
    const any = this.keys().length > 0;
    this.held.clear();
    if (any) this.onChange();
  }

  /** The gamepad's part (configured from the model's bindings); polled on every `keys`/`axes`. */
  readonly gamepad = new GamepadInput();

  /** Names of the keys held now, on the keyboard or a gamepad. */
  keys(): string[] {
    const keys = new Set([...this.held.entries()].filter(([, c]) => c.size > 0).map(([k]) => k));
    if (this.enabled()) for (const k of this.gamepad.poll().keys) keys.add(k);
    return [...keys];
  }

  /** The model's absolute axes a gamepad holds off their rest now (left out: at rest). */
  axes(): Record<string, number> {
    return this.enabled() ? this.gamepad.poll().axes : {};
  }

  /** Whether anything is held, a stick is off centre, or the mouse moved since the last `takeMouse`. */
  get busy(): boolean {
    return this.keys().length > 0 || Object.keys(this.axes()).length > 0 || this.dx !== 0 || this.dy !== 0;
  }

  /** The mouse movement since the previous call (dx, dy), counts. */
  takeMouse(): [number, number] {
    const m: [number, number] = [this.dx, this.dy];
    this.dx = 0;
    this.dy = 0;
    return m;
  }
}
