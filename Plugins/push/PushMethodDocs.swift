import PylonPluginKit

/// What each `push.*` method takes and answers (docs/PUSH.md; the push spec's method table), as
/// `bus.describe` shows it. Every reply carries `code` (0 = success) and push answers bad params
/// with a code itself, so the host checks none of them. Called once from `PushMain.run`.
enum PushMethodDocs {
    typealias P = MethodDoc.Param

    static let code = P("code", .integer, required: true, "0 = success, else a push code (3001, 3012, ...)")
    static let codeMessage = MethodDoc.Result(.object, "", fields: [code, P("message", .string, "")])

    static func declare(_ plugin: Plugin) {
        plugin.describe(
            "setOwner",
            MethodDoc(
                "Admins only: hand an appId to another uid, or release it (null: the next uid to attach it claims it)",
                params: [
                    P("appId", .string, required: true, "an appId a uid attached before"),
                    P("uid", .any, required: true, "an integer uid, or null to release"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("code", .integer, required: true, ""), P("appId", .string, ""), P("ownerUid", .any, "the new owner, or null"),
                        P("previous", .any, "the owner before, or null"),
                    ])))
        plugin.describe(
            "register",
            MethodDoc(
                "Register the device with the push backend (when configuration deferred it) and get its token",
                params: [P("timeoutMs", .integer, "how long to wait for a token")],
                result: .init(
                    .object, "",
                    fields: [P("code", .integer, required: true, "0, or 3001 when no token came in time"), P("token", .string, "")])))
        plugin.describe(
            "setDeviceToken",
            MethodDoc(
                "Use a device token obtained elsewhere", params: [P("token", .string, required: true, "a hex string")],
                result: codeMessage))
        plugin.describe(
            "bind",
            MethodDoc(
                "Bind an app user to this device (a device has at most one user)",
                params: [P("userId", .string, required: true, "")], result: codeMessage))
        plugin.describe(
            "unbind",
            MethodDoc("Unbind an app user from this device", params: [P("userId", .string, required: true, "")], result: codeMessage))
        plugin.describe(
            "openLogReport",
            MethodDoc(
                "Report that the user opened a message (under the push:opens switch)",
                params: [P("userInfo", .object, required: true, "the message as delivered (its id)")], result: codeMessage))
        plugin.describe(
            "liveActivityBind",
            MethodDoc(
                "Submit a Live Activity's push token, filtering repeats",
                params: [
                    P("activityId", .string, required: true, ""), P("pushToken", .string, required: true, ""),
                    P("filter", .string, "abandon, call (default) or refuse"),
                    P("contentStateSchema", .object, "field → type of the activity's content state"),
                    P("appId", .string, "the app the activity belongs to (default: the one this client attached)"),
                ],
                result: .init(
                    .object, "a repeat: {code: 0, dropped: true} (abandon) or a failure with message callRepeat (call)",
                    fields: [code, P("dropped", .boolean, ""), P("message", .string, "")])))
        plugin.describe(
            "attach",
            MethodDoc(
                "Receive an app's messages: the plugin calls callback {message, coldStart} on this client",
                params: [
                    P("appId", .string, required: true, "1-128 of [A-Za-z0-9._-]"),
                    P("callback", .string, required: true, "a method this client provides (bus.provide)"),
                ],
                result: .init(
                    .object, "", fields: [code, P("pending", .integer, "stored messages to deliver now"), P("message", .string, "")])))
        plugin.describe(
            "detach",
            MethodDoc("Stop receiving an app's messages", params: [P("appId", .string, required: true, "")], result: codeMessage))
        plugin.describe(
            "status",
            MethodDoc(
                "Operator view: broker connection, registration, inbox and counters",
                result: .init(
                    .object, "",
                    fields: [
                        code, P("connection", .string, required: true, ""), P("lastError", .string, required: true, ""),
                        P("registration", .string, required: true, ""), P("deviceRegistered", .boolean, required: true, ""),
                        P(
                            "reregistration", .object, required: true,
                            "count, lastMs, reason (credential_rejected, token_unknown, token_replaced), lastCheckMs, checkIntervalMs"),
                        P("attachedApps", .array, required: true, ""), P("inbox", .object, required: true, ""),
                        P("counters", .object, required: true, "received, delivered, acknowledged, duplicates, ..."),
                    ])))
    }
}
