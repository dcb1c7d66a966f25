import PylonPluginKit

/// What each `uploader.*` method takes and answers (docs/UPLOADER.md, "Methods"), as
/// `bus.describe` shows it. `enqueue` is the hot path (routed without a json-c tree): its params
/// are the uploader's to judge; `requeue` and `discard` let the host check theirs first
/// (`hostChecksParams`; the uploader answers the same -32602). Called once from
/// `UploaderMain.run`.
enum UploaderMethodDocs {
    typealias P = MethodDoc.Param

    static let stream = P("stream", .string, required: true, "1-128 of [A-Za-z0-9._:-]; own stream (admin: any)")
    static let ids = P("ids", .array, "record ids (absent: every dead letter of the stream)")

    static func declare(_ plugin: Plugin) {
        plugin.describe(
            "setOwner",
            MethodDoc(
                "Admins only: hand a stream to another owner, or release it (null: the next writer claims it)",
                params: [
                    P("stream", .string, required: true, "1-128 of [A-Za-z0-9._:-]"),
                    P("owner", .any, required: true, "\"uid:N\" or \"plugin:NAME\", or null to release"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("stream", .string, required: true, ""), P("owner", .any, required: true, "the new owner, or null"),
                        P("previous", .any, required: true, "the owner before, or null"),
                    ])))
        plugin.describe(
            "enqueue",
            MethodDoc(
                "Queue records on a stream; answered once they are on disk (all or nothing)",
                params: [
                    stream, P("records", .array, required: true, "1-1000 objects {id, ts?, data?}"),
                    P("consent", .string, "if present, exactly the stream's switch"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("accepted", .integer, required: true, "records stored"),
                        P("duplicates", .integer, required: true, "records already queued (not stored again)"),
                    ])))
        plugin.describe(
            "flush",
            MethodDoc(
                "Upload now",
                params: [
                    P("stream", .string, "one stream (absent: every stream the caller may use)"),
                    P("wait", .boolean, "answer once drained (default false)"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("flushing", .array, "the streams flushed (names)"), P("drained", .boolean, "with wait"),
                        P("delivered", .integer, "with wait"), P("deadLettered", .integer, "with wait"),
                    ])))
        plugin.describe(
            "status",
            MethodDoc(
                "Queue depth per stream, disk use, last upload results (the caller's own streams; admins: all)",
                result: .init(
                    .object, "",
                    fields: [
                        P("streams", .object, required: true, "per stream: owner, consent, queued, oldestAgeMs, lastResult, ..."),
                        P("diskBytes", .integer, required: true, ""), P("maxDiskBytes", .integer, required: true, ""),
                        P("fsync", .string, required: true, ""), P("commits", .integer, required: true, ""),
                        P("owner", .object, "the caller's usage and limits"), P("owners", .object, "admins: each owner's usage, by owner"),
                    ])))
        plugin.describe(
            "deadLetters",
            MethodDoc(
                "The records set aside after a refused batch, oldest first",
                params: [
                    P("stream", .string, "one stream (absent: every stream the caller may use)"), P("limit", .integer, "at most this many"),
                ],
                result: .init(.object, "", fields: [P("deadLetters", .array, required: true, "{stream, id, reason, at_ms, ...}")])))
        plugin.describe(
            "requeue",
            MethodDoc(
                "Queue dead letters of a stream again", params: [stream, ids],
                result: .init(
                    .object, "",
                    fields: [
                        P("stream", .string, required: true, ""), P("requeued", .integer, required: true, ""),
                        P("duplicates", .integer, required: true, ""), P("invalid", .integer, required: true, ""),
                        P("deadLetters", .integer, required: true, "left"),
                    ]),
                hostChecksParams: true))
        plugin.describe(
            "discard",
            MethodDoc(
                "Delete dead letters of a stream", params: [stream, ids],
                result: .init(
                    .object, "",
                    fields: [
                        P("stream", .string, required: true, ""), P("discarded", .integer, required: true, ""),
                        P("deadLetters", .integer, required: true, "left"),
                    ]),
                hostChecksParams: true))
        plugin.describe(
            "configureStream",
            MethodDoc(
                "Change a stream's batching (null: back to the configured value)",
                params: [
                    stream, P("maxCount", .integer, "1-500 records"), P("intervalMs", .integer, "0-86400000"),
                    P("maxBatchBytes", .integer, "1024-8388608"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("stream", .string, required: true, ""), P("maxCount", .integer, required: true, ""),
                        P("intervalMs", .integer, required: true, ""), P("endpoint", .string, required: true, ""),
                    ])))
    }
}
