export { pgCaller, rpcCaller } from "./caller.js";
export type { Answer, ContractCaller, Queryable, RpcClient } from "./caller.js";
export * from "./errors.js";
export { fingerprint } from "./fingerprint.js";
export { takeToken, recordRetryAfter, withSlot, parseRetryAfter } from "./budget.js";
export type { Bucket, SlotOptions } from "./budget.js";
export { CONTRACT_VERSION, checkContract, markSyncCall, runOrResume, pollLoop, createMayExist } from "./worker.js";
export type { RunOrResume, Outcome, PollLoop } from "./worker.js";
