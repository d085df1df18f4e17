// Keyboard and pointer-locked mouse -> held-key set and accumulated mouse movement.
// The keys and whether the mouse counts come from the model's declared action space (GET /v1/model).

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

  /** Names of the keys held now. */
  keys(): string[] {
    return [...this.held.entries()].filter(([, c]) => c.size > 0).map(([k]) => k);
  }

  /** Whether anything is held or the mouse moved since the last `takeMouse`. */
  get busy(): boolean {
    return this.keys().length > 0 || this.dx !== 0 || this.dy !== 0;
  }

  /** The mouse movement since the previous call (dx, dy), counts. */
  takeMouse(): [number, number] {
    const m: [number, number] = [this.dx, this.dy];
    this.dx = 0;
    this.dy = 0;
    return m;
  }
}
