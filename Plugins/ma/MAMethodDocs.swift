import PylonPluginKit

/// What each `ma.*` method takes and answers (docs/MA.md; the MA spec's method table), as
/// `bus.describe` shows it. MA answers bad params with `{"code":-3}` itself, so the host checks
/// none of them (`hostChecksParams` off). Called once from `MAMain.run`.
enum MAMethodDocs {
    typealias P = MethodDoc.Param

    static let appKey = P("appKey", .string, "the AppKey (default: the one this connection last started)")
    /// `{code, message}`: the SDK's completion.
    static let codeMessage = MethodDoc.Result(
        .object, "the SDK's completion: code 0 is success",
        fields: [P("code", .integer, required: true, "0, or an MA error code (-1..-7)"), P("message", .string, required: true, "")])
    static func property(_ summary: String, _ params: [P]) -> MethodDoc {
        MethodDoc(summary, params: [appKey] + params, result: codeMessage)
    }

    static func declare(_ plugin: Plugin) {
        plugin.describe(
            "setOwner",
            MethodDoc(
                "Admins only: hand an AppKey to another uid, or release it (null: the next uid to start it claims it)",
                params: [
                    P("appKey", .string, required: true, "an AppKey already started"),
                    P("uid", .any, required: true, "an integer uid 0-4294967295, or null to release"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("code", .integer, required: true, ""), P("appKey", .string, ""), P("ownerUid", .any, "the new owner, or null"),
                        P("previous", .any, "the owner before, or null"),
                    ])))
        plugin.describe(
            "start",
            MethodDoc(
                "Start (or re-start) MA for an AppKey and confirm the user's identity with the backend",
                params: [
                    P("appKey", .string, required: true, "the AppKey (non-empty after trim)"),
                    P("dataCollectionEnabled", .boolean, "collection for this AppKey from this start on (default true)"),
                    P("userID", .object, "identifiers: userID, anonymousID, email, phone"),
                    P("channel", .string, "configuration (unknown keys are warned about, not refused)"),
                    P("debug", .boolean, "configuration"),
                ],
                result: .init(
                    .object, "", fields: codeMessage.fields + [P("euid", .string, "the EUID for this start")])))
        plugin.describe(
            "identifyAccount",
            MethodDoc(
                "Identify the user; code 0 means a usable EUID was obtained",
                params: [
                    appKey, P("userID", .string, "user id (at most 256 characters)"),
                    P("anonymousID", .string, "anonymous id (at most 256 characters)"),
                    P("email", .string, "local@domain"), P("phone", .string, "+ and 6-20 digits"),
                ],
                result: .init(
                    .object, "",
                    fields: [
                        P("code", .integer, required: true, "0, -3 (no valid identifier), ..."),
                        P("message", .string, required: true, "JSON of per-field results, or success"),
                        P("euid", .string, ""),
                    ])))
        plugin.describe(
            "euid",
            MethodDoc(
                "The AppKey's EUID", params: [appKey],
                result: .init(
                    .object, "",
                    fields: [P("code", .integer, required: true, ""), P("euid", .string, required: true, "null before a successful start")])
            ))
        plugin.describe(
            "eventRecord",
            MethodDoc(
                "Record an event (answered once it is on disk: the uploader's queue, or parked while a start waits; dropped with code 0 while ma:<appKey> is denied)",
                params: [
                    appKey, P("eventName", .string, required: true, "non-empty, not starting with el"),
                    P("property", .object, "at most 500 properties: lowercase [a-z0-9_] keys, strings at most 256 bytes"),
                    P("eventId", .string, "the client's id for the event, 1-100 bytes: stored once however often it is sent"),
                ],
                result: codeMessage))
        plugin.describe(
            "setDataCollectionEnabled",
            MethodDoc(
                "Turn data collection for the AppKey on or off (the ma:<appKey> switch)",
                params: [appKey, P("enabled", .boolean, required: true, "")], result: codeMessage))
        plugin.describe(
            "isDataCollectionEnabled",
            MethodDoc(
                "Whether data collection is on for the AppKey", params: [appKey],
                result: .init(
                    .object, "",
                    fields: [P("code", .integer, required: true, ""), P("enabled", .boolean, required: true, "null when not ready")])))
        plugin.describe(
            "setCollectControl",
            MethodDoc(
                "Which device fields are collected",
                params: [
                    appKey, P("idfa", .boolean, "advertising id (default off)"),
                    P("idfv", .boolean, "per-install vendor id (default off)"), P("carrier", .boolean, "network operator (default on)"),
                ],
                result: codeMessage))
        plugin.describe(
            "setUtmProperties",
            MethodDoc(
                "UTM properties attached to every later event",
                params: [
                    appKey, P("properties", .object, required: true, "utm_source, utm_medium, utm_term, utm_content, utm_campaign, utm_id"),
                ],
                result: codeMessage))
        plugin.describe(
            "setReportInterval",
            MethodDoc(
                "Upload events every interval seconds (default 10)",
                params: [appKey, P("interval", .integer, required: true, "seconds")], result: codeMessage))
        plugin.describe(
            "setMaxEventCacheCount",
            MethodDoc(
                "Upload at once when more events than this are cached (default 50, at most 500)",
                params: [appKey, P("count", .integer, required: true, "")], result: codeMessage))
        plugin.describe(
            "setSessionTimeout",
            MethodDoc(
                "End the session after this long in the background without activity (default 30 minutes)",
                params: [appKey, P("interval", .integer, required: true, "seconds")], result: codeMessage))
        plugin.describe(
            "setAppState",
            MethodDoc(
                "The app went to the foreground or the background",
                params: [appKey, P("state", .string, required: true, "foreground or background")], result: codeMessage))
        plugin.describe(
            "setUserContact",
            MethodDoc(
                "Set contacts (not identifiers); \"\" clears one",
                params: [appKey, P("contacts", .object, required: true, "email, mobile_phone, landline_phone, whatsapp_phone → string")],
                result: codeMessage))
        plugin.describe(
            "setChannelValue",
            MethodDoc(
                "RID/token values of a third-party push channel",
                params: [
                    appKey, P("channelId", .integer, required: true, "the channel (> 0)"),
                    P("values", .array, required: true, "non-empty strings"),
                ],
                result: codeMessage))
        plugin.describe(
            "setProperty",
            property(
                "Set user properties: {properties} or {key, value} (up to 100)",
                [P("properties", .object, "name → value"), P("key", .string, "one property's name"), P("value", .any, "its value")]))
        plugin.describe(
            "increaseProperty",
            property(
                "Add to numeric properties: {key, by} or {properties}",
                [P("key", .string, ""), P("by", .number, ""), P("properties", .object, "name → number")]))
        plugin.describe(
            "addProperty",
            property(
                "Add values to string set properties: {key, by} or {properties}",
                [P("key", .string, ""), P("by", .array, "strings"), P("properties", .object, "name → strings")]))
        plugin.describe(
            "removeProperty",
            property(
                "Remove values from a string set property",
                [P("key", .string, required: true, ""), P("by", .array, required: true, "strings")]))
        plugin.describe(
            "deleteProperty", property("Delete a whole property (missing is ignored)", [P("key", .string, required: true, "")]))
        plugin.describe(
            "updateObjectArrayProperty",
            property(
                "Merge values into the element of an object_array property whose identifierKey is identifierValue",
                [
                    P("key", .string, required: true, ""), P("identifierKey", .string, required: true, ""),
                    P("identifierValue", .any, required: true, "a string or a number"),
                    P("values", .object, required: true, "subfields to merge (null deletes one)"),
                ]))
        plugin.describe(
            "addObjectArrayProperty",
            property(
                "Append one element to an object_array property",
                [P("key", .string, required: true, ""), P("object", .object, required: true, "the element")]))
        plugin.describe(
            "removeObjectArrayProperty",
            property(
                "Remove the element of an object_array property whose identifierKey is identifierValue",
                [
                    P("key", .string, required: true, ""), P("identifierKey", .string, required: true, ""),
                    P("identifierValue", .any, required: true, "a string or a number"),
                ]))
        plugin.describe(
            "status",
            MethodDoc(
                "Operator view: AppKeys, held and waiting events, enqueues",
                result: .init(
                    .object, "",
                    fields: [
                        P("backend", .string, required: true, ""), P("appKeys", .object, required: true, "per AppKey"),
                        P("heldEvents", .integer, required: true, ""), P("waitingEvents", .integer, required: true, ""),
                        P("enqueues", .integer, required: true, ""),
                    ])))
    }
}
