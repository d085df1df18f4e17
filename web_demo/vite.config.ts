import { defineConfig, loadEnv } from "vite";

// `npm run build` writes dist/, which the server serves at "/" (relative asset paths, so any mount works).
// `npm run dev` serves src/ with hot reload and proxies the API to a running server:
// WORLDCAST_SERVER (environment or .env), default http://127.0.0.1:8000.
export default defineConfig(({ mode }) => {
  const server = loadEnv(mode, ".", "WORLDCAST_").WORLDCAST_SERVER ?? "http://127.0.0.1:8000";
  return {
    base: "./",
    build: {
      outDir: "dist",
      emptyOutDir: true,
      // three pages: the interactive demo (WebRTC or LiveKit), the directing page (fMP4 over WebSocket) and the
      // watch page (a viewer's WHEP stream)
      rolldownOptions: { input: { main: "index.html", direct: "direct.html", watch: "watch.html" } },
      // livekit-client (~540 kB) is its own chunk, loaded only in LiveKit mode
      chunkSizeWarningLimit: 1024,
    },
    server: { proxy: { "/v1": { target: server, ws: true }, "/healthz": server } },
  };
});
