import { defineConfig } from "vite";

// The server serves dist/ at "/"; `npm run dev` proxies the API to a local server on :8000.
export default defineConfig({
  base: "./",
  build: { outDir: "dist", emptyOutDir: true },
  server: { proxy: { "/v1": "http://127.0.0.1:8000", "/healthz": "http://127.0.0.1:8000" } },
});
