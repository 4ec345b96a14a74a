// The generated stubs the console uses: the one generation of clients/typescript (never edited
// by hand; scripts check they match proto/).
export * from "../../../../clients/typescript/src/gen/idempost/v1/admin_service_pb.js";
export * from "../../../../clients/typescript/src/gen/idempost/v1/consumer_admin_service_pb.js";
export * from "../../../../clients/typescript/src/gen/idempost/v1/order_events_pb.js";
export { ErrorInfoSchema } from "../../../../clients/typescript/src/gen/google/rpc/error_details_pb.js";
