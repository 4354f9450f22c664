// The realtime session over WebRTC (POST /v1/audio/speech/webrtc, the WHIP convention): the
// realtime socket's JSON messages on a data channel labelled "voicehost", the audio on the
// peer's Opus track. A PeerLink sends as a WebSocket does (send, close), so the Speak view
// drives either the same way.

import { call, speechCredential } from "./api.js";

const PATH = "/v1/audio/speech/webrtc";
const GATHER_MS = 5000; // non-trickle: the offer waits for every candidate, this long at most
const CONNECT_MS = 15000; // from the answer to the data channel's opening
const OPUS_RATE = 48000; // the track's decoded rate

// The server's STUN/TURN servers, from the Link headers of its last answer: the next session
// of this page offers candidates through them too (the first one offers host candidates).
let iceServers = [];

// The ICE servers of an answer's Link headers (fetch joins them with ", "):
// <url>; rel="ice-server"; username="..."; credential="..."
export function iceServersOf(links) {
  const servers = [];
  for (const link of (links || "").split(/,\s*(?=<)/)) {
    const url = /^\s*<([^>]+)>/.exec(link);
    if (!url) continue;
    const params = {};
    const pairs = link.matchAll(/;\s*([\w-]+)\s*=\s*(?:"([^"]*)"|([^;,\s]+))/g);
    for (const [, name, quoted, bare] of pairs) {
      params[name.toLowerCase()] = quoted !== undefined ? quoted : bare;
    }
    if (params.rel !== "ice-server") continue;
    const server = { urls: url[1] };
    if (params.username !== undefined) server.username = params.username;
    if (params.credential !== undefined) server.credential = params.credential;
    servers.push(server);
  }
  return servers;
}

function gathered(pc) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => {
      if (pc.iceGatheringState === "complete") done();
    };
    const timer = setTimeout(done, GATHER_MS);
    pc.addEventListener("icegatheringstatechange", check);
    check();
  });
}

export function webRtcAvailable() {
  return typeof RTCPeerConnection === "function";
}

export class PeerLink {
  // onOpen(): the data channel is open (send the config); onMessage(text): an event;
  // onTrack(stream): the server's audio; onClose(reason): the session is over, reason
  // "page" (closed here), "server" (the server ended it) or an error's words.
  constructor({ onOpen, onMessage, onTrack, onClose }) {
    this.handlers = { onOpen, onMessage, onTrack, onClose };
    this.pc = null;
    this.channel = null;
    this.location = null; // the session's URL, for its DELETE
    this.credential = undefined; // what it was opened with (a speech token), for its DELETE
    this.ended = false;
    this.timer = null;
  }

  // Offer, answer, connect; the handlers say what follows. Throws (ApiError) if refused.
  async connect() {
    const pc = new RTCPeerConnection({ iceServers });
    this.pc = pc;
    const channel = pc.createDataChannel("voicehost");
    this.channel = channel;
    pc.addTransceiver("audio", { direction: "recvonly" });
    pc.addEventListener("track", (event) => {
      if (this.ended) return;
      this.handlers.onTrack(event.streams[0] || new MediaStream([event.track]));
    });
    channel.addEventListener("open", () => {
      clearTimeout(this.timer);
      if (!this.ended) this.handlers.onOpen();
    });
    channel.addEventListener("message", (event) => {
      if (!this.ended && typeof event.data === "string") this.handlers.onMessage(event.data);
    });
    channel.addEventListener("close", () => this.finish("server", false));
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed") this.finish("the WebRTC connection failed", true);
    });
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      if (this.ended) return;
      this.credential = await speechCredential(); // a speech token where the server mints them
      const response = await call(PATH, {
        method: "POST",
        body: pc.localDescription.sdp,
        contentType: "application/sdp",
        credential: this.credential,
      });
      this.location = response.headers.get("Location");
      const answer = await response.text();
      iceServers = iceServersOf(response.headers.get("Link"));
      if (this.ended) {
        await this.finish("page", true);
        return;
      }
      await pc.setRemoteDescription({ type: "answer", sdp: answer });
      this.timer = setTimeout(() => {
        this.finish("the WebRTC connection did not open (ICE found no path)", true);
      }, CONNECT_MS);
    } catch (error) {
      this.finish(null, true);
      throw error;
    }
  }

  // Seconds of audio the track has given out from real packets (the jitter buffer's output,
  // less what it concealed): the listener's clock over WebRTC. 0 before any.
  async playedSeconds() {
    if (!this.pc) return 0;
    const stats = await this.pc.getStats();
    for (const report of stats.values()) {
      if (report.type === "inbound-rtp" && report.kind === "audio") {
        const samples = (report.totalSamplesReceived || 0) - (report.concealedSamples || 0);
        return samples / OPUS_RATE;
      }
    }
    return 0;
  }

  send(text) {
    if (this.channel && this.channel.readyState === "open") this.channel.send(text);
  }

  // The page ends the session: DELETE its URL, then close the peer connection.
  close() {
    return this.finish("page", true);
  }

  // Once: the page hears of the end at once, then the session is hung up (DELETE, when the
  // server has not ended it itself) and the peer connection closed.
  async finish(reason, hangUp) {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.timer);
    if (reason !== null) this.handlers.onClose(reason);
    if (hangUp && this.location) {
      try {
        await call(this.location, { method: "DELETE", credential: this.credential });
      } catch {
        // gone already: closing the peer connection ends it too
      }
    }
    if (this.pc) this.pc.close();
  }
}
