"""A session's frames on their way to the sinks: what every transport shares (issue 30's frame pipeline).

Today: `frame_queue`, the bounded drop-oldest buffer every frame sink is built on; `picture`, the one
preparation of a frame's picture (upscale, stamp, yuv420p) that the WebRTC track, the fMP4 stream and LiveKit
all publish; `stamp`, the machine-readable frame stamp drawn into it (measurement only); `h264`, the one
libx264 configuration of the fMP4 stream and LiveKit's pre-encoded track.
"""
