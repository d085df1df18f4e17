// Downloading a session's recording: its film (GET /v1/sessions/{id}/recording, video/mp4) and its event log
// (GET /v1/sessions/{id}/recording/events, application/jsonl) need the session's token in an Authorization
// header, which a plain link cannot carry, so each is fetched and handed to the browser as a file
// (docs/recordings.md). Both stay downloadable for the retention time after the session closes.

/** What a download link fetches: the film or the event log. */
export type RecordingPart = "film" | "events";

const PATHS: Record<RecordingPart, { suffix: string; name: string }> = {
  film: { suffix: "recording", name: "mp4" },
  events: { suffix: "recording/events", name: "events.jsonl" },
};

/** Fetch one part of session `id`'s recording with its `token` and save it as `<id>.mp4` / `<id>.events.jsonl`.
 * Rejects with the HTTP status (and the server's reason) when the server refuses. */
export async function downloadRecording(id: string, token: string, part: RecordingPart): Promise<void> {
  const { suffix, name } = PATHS[part];
  const r = await fetch(`/v1/sessions/${id}/${suffix}`, { headers: { Authorization: `Bearer ${token}` } });
  if (!r.ok) throw new Error(`recording ${part}: ${r.status} ${await r.text()}`);
  const url = URL.createObjectURL(await r.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = `${id}.${name}`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
