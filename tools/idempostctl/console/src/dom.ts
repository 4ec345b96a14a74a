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
    parent.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
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
