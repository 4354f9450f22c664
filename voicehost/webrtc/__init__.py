"""The WebRTC peer's own rules, apart from HTTP: the ICE servers and ports, where ICE may send
checks (``ice``), and what an offer or a trickled fragment must hold (``offer``). The
``/v1/audio/speech/webrtc`` resource (``voicehost.api.webrtc``) answers with them."""
