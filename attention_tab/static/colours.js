// The colours of the tab: weights on the heatmap images' scale (inspection/heatmap.py: viridis on
// the square root of the weight, 256 levels; cells a query cannot see grey), one colour per head, and a
// diverging scale (blue, white, red) for signed numbers: shares of a logit, what a patch restores.

let LEVELS = null;  // [256][3]: level i is viridis at i / 255, as the settings route sends the heatmaps' table
let PACKED = null;  // the same levels as RGBA packed in one 32-bit word each (ImageData's byte order, little-endian)
let PACKED_FUTURE = null;

// The heatmaps' colours, from the settings route: colormap [256][3] and future [3]. Called once, before anything is drawn.
export function useColours({colormap, future}) {
  LEVELS = colormap;
  PACKED = new Uint32Array(new Uint8Array(colormap.flatMap((rgb) => [...rgb, 255])).buffer);
  PACKED_FUTURE = new Uint32Array(new Uint8Array([...future, 255]).buffer)[0];
}

// Whether a query cannot see a key: the future, and with the model's window W (null: none) the
// keys W or more back, as inspection/heatmap.py's hidden_cells draws them.
export function hidden(query, key, windowSize) {
  return key > query || (windowSize !== null && windowSize !== undefined && query - key >= windowSize);
}

// A head's T x T map into a canvas, one pixel per cell (CSS scales it up, unsmoothed); windowSize: the model's.
export function paintMap(canvas, map, T, windowSize = null) {
  if (canvas.width !== T || canvas.height !== T) [canvas.width, canvas.height] = [T, T];
  const context = canvas.getContext("2d");
  const image = context.createImageData(T, T);
  const pixels = new Uint32Array(image.data.buffer);
  for (let query = 0; query < T; query++) {
    for (let key = 0; key < T; key++) {
      const weight = map[query * T + key];
      pixels[query * T + key] = hidden(query, key, windowSize) ? PACKED_FUTURE
        : PACKED[Math.round(Math.sqrt(Math.min(1, Math.max(0, weight || 0))) * 255)];  // NaN (a model gone non-finite) as 0
    }
  }
  context.putImageData(image, 0, 0);
}

// A weight (or a score from 0 to 1) as a CSS colour, on the maps' scale.
export function weightColour(weight) {
  return viridis(Math.sqrt(Math.min(1, Math.max(0, weight || 0))));
}

// x from 0 to 1 as a CSS colour, viridis on a linear scale.
export function viridis(x) {
  const [r, g, b] = LEVELS[Math.round(Math.min(1, Math.max(0, x || 0)) * 255)];
  return `rgb(${r} ${g} ${b})`;
}

const [NEGATIVE, ZERO, POSITIVE] = [[33, 102, 172], [247, 247, 247], [178, 24, 43]];  // ColorBrewer's RdBu ends and middle

// A signed value as CSS colours on a diverging scale: white at 0, full blue at -scale, full red
// at +scale (and beyond); {background, ink}, the ink readable on the background.
export function divergingColour(value, scale) {
  const t = Math.max(-1, Math.min(1, (value || 0) / (scale || 1)));
  const end = t < 0 ? NEGATIVE : POSITIVE;
  const [r, g, b] = ZERO.map((c, channel) => Math.round(c + Math.abs(t) * (end[channel] - c)));
  return {background: `rgb(${r} ${g} ${b})`, ink: Math.abs(t) > 0.55 ? "#fff" : "#202124"};
}

// Head h of n: hues spread around the wheel, dark enough to read on white.
export function headColour(head, nHead) {
  return `hsl(${Math.round((360 * head) / Math.max(nHead, 1))} 80% 40%)`;
}
