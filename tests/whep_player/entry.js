// The player as Eyevinn ships it (npm @eyevinn/webrtc-player), unchanged: tests/test_browser_whep.py drives it.
import { WebRTCPlayer } from "@eyevinn/webrtc-player";

window.WebRTCPlayer = WebRTCPlayer;
