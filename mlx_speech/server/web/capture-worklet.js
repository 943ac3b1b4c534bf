// Microphone capture on the audio thread: the context runs at the model's rate, so the samples
// arrive already at that rate; they are cut into frames of `frameSize` and posted to the page.
// "flush" posts what is left of the last frame (nothing is dropped when the microphone stops).

class MlxCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.frameSize = options.processorOptions.frameSize;
    this.buf = new Float32Array(this.frameSize);
    this.n = 0;
    this.port.onmessage = (e) => {
      if (e.data === "flush") {
        const rest = this.buf.slice(0, this.n);
        this.n = 0;
        this.port.postMessage({ flushed: rest }, [rest.buffer]);
      }
    };
  }

  process(inputs) {
    const x = inputs[0] && inputs[0][0];
    if (!x) return true; // nothing connected (yet)
    let i = 0;
    while (i < x.length) {
      const k = Math.min(x.length - i, this.frameSize - this.n);
      this.buf.set(x.subarray(i, i + k), this.n);
      this.n += k;
      i += k;
      if (this.n === this.frameSize) {
        const frame = this.buf;
        this.port.postMessage({ frame }, [frame.buffer]);
        this.buf = new Float32Array(this.frameSize);
        this.n = 0;
      }
    }
    return true;
  }
}

registerProcessor("mlx-capture", MlxCapture);
