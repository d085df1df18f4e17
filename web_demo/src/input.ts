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

export class InputState {
  private held = new Map<string, Set<string>>(); // model key -> browser codes holding it
  private dx = 0;
  private dy = 0;
  /** Called on every key down/up that changes the held set. */
  onChange: () => void = () => {};

  constructor(private readonly mouseTarget: HTMLElement, private readonly enabled: () => boolean) {
    window.addEventListener("keydown", (e) => this.key(e, true));
    window.addEventListener("keyup", (e) => this.key(e, false));
    window.addEventListener("blur", () => this.releaseAll());
    mouseTarget.addEventListener("click", () => {
      if (this.enabled()) mouseTarget.requestPointerLock?.();
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
    if (!name || !this.enabled() || (e.target as HTMLElement)?.tagName === "INPUT") return;
    e.preventDefault();
    const codes = this.held.get(name) ?? new Set<string>();
    const before = codes.size > 0;
    if (down) codes.add(e.code);
    else codes.delete(e.code);
    this.held.set(name, codes);
    if (before !== codes.size > 0) this.onChange();
  }

  releaseAll(): void {
    if ([...this.held.values()].some((c) => c.size > 0)) {
      this.held.clear();
      this.onChange();
    }
  }

  keys(): string[] {
    return [...this.held.entries()].filter(([, c]) => c.size > 0).map(([k]) => k);
  }

  /** Whether anything is held or the mouse moved since the last `takeMouse`. */
  get busy(): boolean {
    return this.keys().length > 0 || this.dx !== 0 || this.dy !== 0;
  }

  takeMouse(): [number, number] {
    const m: [number, number] = [this.dx, this.dy];
    this.dx = 0;
    this.dy = 0;
    return m;
  }
}
