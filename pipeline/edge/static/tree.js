// The tree of a run and its sub-runs (WAI-ARIA tree: arrows move, Left/Right fold,
// Home/End jump, Enter or Space selects). One treeitem per run, kept across renders.
import { count, el, stateBadge } from "./common.js";

export class RunTree {
  constructor(container, model, onSelect) {
    this.container = container;
    this.model = model;
    this.onSelect = onSelect;
    this.items = new Map(); // run id → { li, row, badge, tokens, group, node }
    this.folded = new Set();
    this.selected = model.root.id;
    this.structure = -1;
    container.setAttribute("role", "tree");
    container.setAttribute("aria-label", "runs of this run");
    container.addEventListener("keydown", (e) => this.key(e));
  }

  label(node) {
    const parent = node.parent;
    if (parent && node.id.startsWith(`${parent.id}.`)) return node.id.slice(parent.id.length + 1);
    return node.id;
  }

  item(node) {
    let entry = this.items.get(node.id);
    if (entry) return entry;
    const li = el("li");
    li.setAttribute("role", "treeitem");
    li.dataset.run = node.id;
    li.tabIndex = -1;
    const row = el("div", "tree-row");
    const twisty = el("span", "twisty");
    twisty.setAttribute("aria-hidden", "true");
    const name = el("span", "tree-name", this.label(node));
    name.title = node.id;
    const badge = stateBadge(node.state);
    const meta = el("span", "tree-meta");
    row.append(twisty, name, badge, meta);
    const prompt = el("span", "tree-prompt");
    row.append(prompt);
    const group = el("ul");
    group.setAttribute("role", "group");
    li.append(row, group);
    row.addEventListener("click", () => this.select(node.id, true));
    twisty.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(node.id); });
    entry = { li, row, twisty, badge, meta, prompt, group, node };
    this.items.set(node.id, entry);
    return entry;
  }

  render() {
    if (this.structure !== this.model.structure) {
      this.structure = this.model.structure;
      const place = (node, list, level) => {
        const entry = this.item(node);
        entry.li.setAttribute("aria-level", String(level));
        if (entry.li.parentNode !== list) list.append(entry.li);
        const kids = [...node.children].sort((a, b) => (a.start ?? Infinity) - (b.start ?? Infinity));
        kids.forEach((kid, i) => {
          place(kid, entry.group, level + 1);
          const li = this.items.get(kid.id).li;
          if (entry.group.children[i] !== li) entry.group.insertBefore(li, entry.group.children[i] || null);
        });
      };
      place(this.model.root, this.container, 1);
    }
    for (const entry of this.items.values()) this.update(entry);
    if (!this.container.querySelector('[tabindex="0"]')) this.items.get(this.selected)?.li.setAttribute("tabindex", "0");
  }

  update(entry) {
    const node = entry.node;
    const open = !this.folded.has(node.id);
    if (node.children.length) entry.li.setAttribute("aria-expanded", String(open));
    else entry.li.removeAttribute("aria-expanded");
    entry.twisty.textContent = node.children.length ? (open ? "▾" : "▸") : "";
    entry.group.hidden = !open;
    entry.li.setAttribute("aria-selected", String(node.id === this.selected));
    if (!node.changed && entry.rendered) return;
    entry.rendered = true;
    stateBadge(node.state, entry.badge);
    const usage = node.usage;
    entry.meta.textContent = usage.reports ? `${count(usage.input)} in · ${count(usage.output)} out` : "";
    entry.prompt.textContent = node.prompt || "";
    entry.prompt.hidden = !node.prompt;
  }

  visible() {
    return [...this.container.querySelectorAll('li[role="treeitem"]')].filter((li) => !li.closest("ul[hidden]"));
  }

  focus(id) {
    for (const entry of this.items.values()) entry.li.tabIndex = entry.node.id === id ? 0 : -1;
    this.items.get(id)?.li.focus();
  }

  select(id, focus = false) {
    this.selected = id;
    for (const entry of this.items.values()) entry.li.setAttribute("aria-selected", String(entry.node.id === id));
    if (focus) this.focus(id);
    this.onSelect(id);
  }

  toggle(id, open = this.folded.has(id)) {
    if (open) this.folded.delete(id); else this.folded.add(id);
    this.update(this.items.get(id));
  }

  key(e) {
    const li = e.target.closest('li[role="treeitem"]');
    if (!li) return;
    const id = li.dataset.run;
    const node = this.items.get(id).node;
    const list = this.visible();
    const at = list.indexOf(li);
    const go = (target) => { if (target) this.select(target.dataset.run, true); };
    switch (e.key) {
      case "ArrowDown": go(list[at + 1]); break;
      case "ArrowUp": go(list[at - 1]); break;
      case "Home": go(list[0]); break;
      case "End": go(list[list.length - 1]); break;
      case "ArrowRight":
        if (node.children.length && this.folded.has(id)) this.toggle(id, true);
        else if (node.children.length) go(this.items.get(node.children[0].id).li);
        break;
      case "ArrowLeft":
        if (node.children.length && !this.folded.has(id)) this.toggle(id, false);
        else if (node.parent) go(this.items.get(node.parent.id).li);
        break;
      case "Enter": case " ": this.select(id, true); break;
      default: return;
    }
    e.preventDefault();
  }
}
