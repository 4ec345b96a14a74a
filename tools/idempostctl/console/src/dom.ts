// A few DOM helpers: elements are built with the DOM API (no innerHTML), so nothing a service
// returns is ever parsed as markup, and the CSP needs no inline anything.
type Child = Node | string | number | bigint | null | undefined | false;
type Attributes = Record<string, string | boolean | undefined>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Attributes = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === false) continue;
    element.setAttribute(name, value === true ? "" : value);
  }
  append(element, children);
  return element;
}

export function append(parent: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    parent.appendChild(child instanceof Node ? child : document.createTextNode(visible(String(child))));
  }
}

// Control characters (ANSI escapes, carriage returns, C1 controls) and the characters that
// reorder displayed text, written as escapes: text a service returns (a dead letter's error, a
// parked event's reason from a record's headers) is shown as it is, never allowed to reorder or
// hide what is around it. Newlines and tabs are plain whitespace in a table cell and stay.
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

export function visible(text: string): string {
  return text.replace(CONTROL, (c) => `\\u{${c.codePointAt(0)!.toString(16)}}`);
}

export function replace(parent: Element, ...children: Child[]): void {
  parent.replaceChildren();
  append(parent, children);
}

export function table(header: string[], rows: Child[][], testId?: string): HTMLTableElement {
  return h(
    "table",
    { "data-testid": testId },
    h("thead", {}, h("tr", {}, ...header.map((title) => h("th", {}, title)))),
    h("tbody", {}, ...rows.map((row) => h("tr", {}, ...row.map((cell) => h("td", {}, cell))))),
  );
}
