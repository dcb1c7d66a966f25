import PylonPluginKit

/// What each `gtm.*` method takes and answers (docs/GTM.md; the tag-manager spec's method
/// table), as `bus.describe` shows it. The methods that answer a missing or mistyped param with
/// -32602 themselves let the host check them first (`hostChecksParams`). Called once from
/// `GTMMain.run`.
enum GTMMethodDocs {
    typealias P = MethodDoc.Param

    static let uid = P("uid", .integer, "admins: act on that uid's tag-manager state")
    static let containerId = P("containerId", .string, required: true, "e.g. GTM-1234")

    static func declare(_ plugin: Plugin) {
        plugin.describe(
            "openContainer",
            MethodDoc(
                "Open a container (opening an open one returns it)",
                params: [
                    containerId, P("openType", .string, "prefer_non_default (default), prefer_fresh or default"),
                    P("timeoutMs", .integer, "how long to wait for a non-default container (default 2000)"), uid,
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("containerId", .string, required: true, ""), P("isDefault", .boolean, required: true, ""),
                        P("source", .string, required: true, "default, saved or network"), P("version", .string, required: true, ""),
                        P("stale", .boolean, required: true, "older than 12 hours"), P("lastRefreshMs", .integer, required: true, ""),
                    ]),
                hostChecksParams: true))
        plugin.describe(
            "closeContainer",
            MethodDoc(
                "Close a container", params: [containerId, uid],
                result: .init(.object, "", fields: [P("closed", .boolean, required: true, "false when it was not open")]),
                hostChecksParams: true))
        plugin.describe(
            "getValue",
            MethodDoc(
                "A configuration value of an open container (the type's default when the key is missing); behind the "
                    + "container's pending first open it waits for that open's answer",
                params: [
                    containerId, P("key", .string, required: true, ""),
                    P("type", .string, "string (default), bool, double or int64"), uid,
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("value", .any, required: true, "of the asked type"),
                        P("open", .boolean, "false (with the type default) when the container is not open"),
                        P("reason", .string, "with open false: not_open, not_loaded (opened without any container) or opening"),
                    ]),
                hostChecksParams: true))
        plugin.describe(
            "push",
            MethodDoc(
                "Merge a map into the data layer; an event key fires tags",
                params: [P("data", .object, required: true, "e.g. {\"event\": \"openScreen\", \"screenName\": \"Home\"}"), uid],
                result: .init(
                    .object, "",
                    fields: [
                        P("queued", .boolean, required: true, "true once its tags ran and their hits are durable (uploader or gtm.db)"),
                        P("containers", .integer, required: true, "the caller's open containers it fires tags in"),
                    ]),
                hostChecksParams: true))
        plugin.describe(
            "refresh",
            MethodDoc(
                "Request the container from the network now (rate-limited)", params: [containerId, uid],
                result: .init(
                    .object, "",
                    fields: [P("accepted", .boolean, required: true, ""), P("reason", .string, "why not (rate limit, not open)")]),
                hostChecksParams: true))
        plugin.describe(
            "preview",
            MethodDoc(
                "Enter or leave a container's preview (draft) with a preview URL",
                params: [P("url", .string, required: true, "tagmanager.c.<app id>://preview/p?id=...&gtm_auth=...&gtm_preview=..."), uid],
                result: .init(.object, "", fields: [P("preview", .boolean, required: true, "whether it was a valid preview URL")])))
        for (name, what) in [("registerFunctionCallMacro", "macro"), ("registerFunctionCallTag", "tag")] {
            plugin.describe(
                name,
                MethodDoc(
                    "Register a function-call \(what) handler served by this client (bus.provide)",
                    params: [
                        P("name", .string, required: true, "the function name in the container"),
                        P("method", .string, required: true, "the method this client provides; called as {name, parameters}"), uid,
                    ],
                    result: .init(.object, "", fields: [P("registered", .boolean, required: true, "")]),
                    hostChecksParams: true))
        }
        plugin.describe(
            "setLogLevel",
            MethodDoc(
                "The caller's tag-manager log level",
                params: [P("level", .string, required: true, "verbose, debug, info, warning, error or none"), uid],
                result: .init(.object, "", fields: [P("level", .string, required: true, "")]), hostChecksParams: true))
        plugin.describe(
            "logLines",
            MethodDoc(
                "The caller's recent log lines after sequence number since",
                params: [
                    P("since", .integer, "sequence number (default 0)"), P("limit", .integer, "at most this many (1-10000)"),
                    P("all", .boolean, "admins: every owner's lines"), uid,
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("lines", .array, required: true, "{seq, level, message, ts, uid|plugin}"),
                        P("next", .integer, required: true, "the since of the next call"),
                    ])))
        plugin.describe(
            "status",
            MethodDoc(
                "Operator view: open containers, log level, held hits (admins: every owner)", params: [uid],
                result: .init(
                    .object, "",
                    fields: [
                        P("logLevel", .string, required: true, ""), P("hitsHeld", .integer, required: true, ""),
                        P("owners", .array, "admins: each owner"),
                    ])))
    }
}
