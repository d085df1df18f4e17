// Keyboard and pointer-locked mouse -> held-key set and accumulated mouse movement.

/** Browser key codes -> the model's key names (arrows drive W/A/S/D). */
const KEY_MAP: Record<string, string> = {
  KeyW: "w", ArrowUp: "w",
  KeyA: "a", ArrowLeft: "a",
  KeyS: "s", ArrowDown: "s",
  KeyD: "d", ArrowRight: "d",
  Space: "space",
  ShiftLeft: "shift", ShiftRight: "shift",
};

function isTyping(target: EventTarget | null): boolean {
  const el = target as HTMLElement | null;
  return !!el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.isContentEditable);
}

export class InputState {
  /** Model key names this session accepts (from ModelInfo.keys); others are never sent. */
  allowed = new Set<string>(Object.values(KEY_MAP));
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
      if (!this.enabled() || document.pointerLockElement === mouseTarget) return;
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
    const name = KEY_MAP[e.code];
    if (!name || !this.allowed.has(name) || !this.enabled()) return;
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
