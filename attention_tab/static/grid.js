// The tools' grids (layers x heads, layers x positions): a table of coloured cells, a header row
// of column names and a first column of row names. Each cell holds its exact value in data-value
// and says it in its title, which the browser shows on hover.
import {el, formatValue} from "./dom.js";

// rows, columns: names (strings or nodes); values[r][c] (null: none); colour(value) ->
// {background, ink}; describe(r, c, value) -> the title; cellData(r, c) -> more attributes;
// text: whether cells print their value (too narrow for it past 8 columns or so).
export function valueGrid({className, rows, columns, values, colour, describe, text = true, digits = 2,
                           cellData = () => ({}), onclick = null}) {
  const cell = (value, r, c) => {
    const {background, ink} = colour(value);
    return el("td", {class: "cell", style: `background:${background};color:${ink}`, "data-value": value ?? "",
      title: describe(r, c, value), ...cellData(r, c), ...(onclick ? {onclick: () => onclick(r, c)} : {})},
    text ? formatValue(value, digits) : "");
  };
  return el("table", {class: `value-grid ${className}${onclick ? " clickable" : ""}`},
    el("tr", {}, el("th"), ...columns.map((column) => el("th", {}, column))),
    ...values.map((row, r) => el("tr", {}, el("th", {}, rows[r]), ...row.map((value, c) => cell(value, r, c)))));
}

// What the page shows for a token: “·Mary”.
export const quote = (label) => `“${label}”`;

// A grid wider than this shows colours only; each cell's title holds its value.
export const MAX_TEXT_COLUMNS = 8;
