// Streaming playback: s16le mono PCM at 24 kHz, as the API sends it, into an AudioWorklet
// (pcm-player.worklet.js) that plays each chunk as soon as it arrives. The player says where
// in the stream the listener is (by the audio clock, not by when bytes came) and how loud it is.

export const SAMPLE_RATE = 24000;

let context = null;
let loading = null;

// The page's one AudioContext, made on the first click (browsers start audio on a gesture).
async function audioContext() {
  if (context === null) {
    context = new AudioContext({ sampleRate: SAMPLE_RATE });
    loading = context.audioWorklet.addModule("/playground/pcm-player.worklet.js");
  }
  await loading;
  if (context.state !== "running") await context.resume();
  return context;
}

// The root mean square of an analyser's last window, 0 to 1 of full scale.
export function rmsOf(analyser, samples) {
  analyser.getFloatTimeDomainData(samples);
  let sum = 0;
  for (const sample of samples) sum += sample * sample;
  return Math.sqrt(sum / samples.length);
}

export class StreamPlayer {
  // onStats({received, played, queued}): what the worklet has received and played, in samples.
  constructor(onStats) {
    this.onStats = onStats;
    this.node = null;
    this.analyser = null;
    this.window = null;
    this.carry = null; // an odd byte left from the last chunk
    this.received = 0;
    this.epoch = 0;
    this.skipped = 0; // samples of the stream never given to the worklet (a barge-in's tail)
    this.clock = { played: 0, dropped: 0, queued: 0, time: 0 }; // the worklet's last report
  }

  async open() {
    if (this.node) return;
    const ctx = await audioContext();
    this.node = new AudioWorkletNode(ctx, "pcm-player", { outputChannelCount: [1] });
    this.node.connect(ctx.destination);
    this.analyser = ctx.createAnalyser();
    this.analyser.fftSize = 1024;
    this.window = new Float32Array(this.analyser.fftSize);
    this.node.connect(this.analyser); // measured beside what is heard
    this.node.port.postMessage({ type: "reset", epoch: this.epoch }); // reset before open
    this.node.port.onmessage = (event) => {
      const message = event.data;
      if (message.epoch !== this.epoch) return; // from before the last reset
      if (message.received !== undefined) this.received = message.received;
      if (message.type === "played") {
        const { played, dropped, queued, time } = message;
        this.clock = { played, dropped, queued, time };
      }
      this.onStats(message);
    };
  }

  // A new stream: its clock and counts from 0.
  reset() {
    this.carry = null;
    this.epoch += 1;
    this.received = 0;
    this.skipped = 0;
    this.clock = { played: 0, dropped: 0, queued: 0, time: 0 };
    if (this.node) this.node.port.postMessage({ type: "reset", epoch: this.epoch });
  }

  // Float32 samples of s16le bytes (any length: an odd byte waits for the next chunk).
  samplesOf(bytes) {
    let data = new Uint8Array(bytes);
    if (this.carry !== null) {
      const joined = new Uint8Array(data.length + 1);
      joined[0] = this.carry;
      joined.set(data, 1);
      data = joined;
      this.carry = null;
    }
    if (data.length % 2 === 1) {
      this.carry = data[data.length - 1];
      data = data.subarray(0, data.length - 1);
    }
    const count = data.length / 2;
    const view = new DataView(data.buffer, data.byteOffset, data.length);
    const samples = new Float32Array(count);
    for (let i = 0; i < count; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    return samples;
  }

  // Bytes of s16le PCM to play; returns samples.
  push(bytes) {
    const samples = this.samplesOf(bytes);
    const count = samples.length; // before the transfer empties it
    if (count > 0) this.node.port.postMessage({ type: "samples", samples }, [samples.buffer]);
    return count;
  }

  // Bytes of the stream that are not played (they came after a barge-in): counted, so the
  // stream's clock stays the server's.
  skip(bytes) {
    const count = this.samplesOf(bytes).length;
    this.skipped += count;
    return count;
  }

  // Barge-in: drop what is queued, at once.
  clear() {
    this.carry = null;
    if (this.node) this.node.port.postMessage({ type: "clear" });
  }

  // Seconds of the stream the listener has heard: what the worklet played (and what was
  // dropped or skipped before it) by the audio clock's time less the output's latency, carried
  // on from the worklet's last report (at most by what it had queued).
  position() {
    if (!this.node || this.clock.time === 0) return 0;
    const { played, dropped, queued, time } = this.clock;
    const since = context.currentTime - (context.outputLatency || 0) - time;
    const playing = since >= 0 ? Math.min(queued, since * SAMPLE_RATE) : since * SAMPLE_RATE;
    return Math.max(0, (played + dropped + this.skipped + playing) / SAMPLE_RATE);
  }

  // The level of what plays now, 0 to 1 (RMS of full scale).
  level() {
    return this.analyser ? rmsOf(this.analyser, this.window) : 0;
  }
}
