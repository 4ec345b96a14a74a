// What every page of the console is given: its own module, so that the pages and the shell that
// mounts them do not import each other.
import type { Api, Failure } from "./api.js";

export interface Config {
  jaegerUrl: string | null;
}

/** What every page gets. */
export interface Context {
  api: Api;
  config: Config;
  /** Shows a refusal in the banner (or clears it with null). */
  report(problem: Failure | null): void;
  /** Shows another page, such as an event's timeline. */
  show(page: PageName, argument?: string): void;
}

export type PageName = "backlog" | "timeline" | "failed" | "purge" | "replay";
