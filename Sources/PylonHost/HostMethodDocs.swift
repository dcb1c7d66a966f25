import PylonProtocol

/// What each host method (`HostMethod.served`) takes and answers, as `bus.describe` shows it
/// (docs/PROTOCOL.md, "Host methods"). A unit test requires a doc for every served method.
extension Bus {
    typealias P = MethodDoc.Param

    static let consentResult = MethodDoc.Result(
        .object, "the switch after the change",
        fields: [
            P("key", .string, required: true, "the switch"), P("granted", .boolean, required: true, "its own value now"),
            P("layer", .string, required: true, "operator or app"), P("changed", .boolean, required: true, "whether it changed"),
            P("epoch", .integer, required: true, "consent epoch"),
        ])
    static let keyParam = P("key", .string, required: true, "the switch, e.g. device, ma:<appKey> (aliases: switch, name)")

    static let hostMethodDocs: [String: MethodDoc] = [
        HostMethod.ping: MethodDoc(
            "Liveness check of the host",
            result: .init(
                .object, "",
                fields: [P("pong", .boolean, required: true, "always true"), P("version", .string, required: true, "pylond's version")])),
        HostMethod.status: MethodDoc(
            "The daemon's state: plugins, clients (non-admins: their own), counters, limits, consent",
            result: .init(
                .object, "",
                fields: [
                    P("version", .string, required: true, ""), P("state", .string, required: true, "starting, running or stopping"),
                    P("plugins", .array, required: true, "one entry per plugin: name, pid, state, restarts, ..."),
                    P("clients", .array, required: true, "client connections"), P("counters", .object, required: true, ""),
                    P("consent", .object, required: true, "switches the caller may see"),
                ])),
        HostMethod.describe: MethodDoc(
            "The methods the host and each plugin serve, with params, results and consent switches",
            params: [P("format", .string, "pylon (default) or openrpc: an OpenRPC 1.2.6 document")],
            result: .init(
                .object, "Pylon's form: host, hostMethods, plugins, provided, protocol; or the OpenRPC document",
                fields: [
                    P("hostMethods", .array, "the host's methods with their docs"),
                    P("plugins", .object, "each plugin's manifest and state"),
                    P("provided", .object, "methods clients provide (non-admins: their own) → client id"),
                ])),
        HostMethod.subscribe: MethodDoc(
            "Receive publications on topics matching a pattern (`*` matches any run)",
            params: [P("pattern", .string, required: true, "topic pattern, e.g. push.* (alias: topic)")],
            result: .init(.object, "", fields: [P("subscriptions", .array, required: true, "this connection's patterns")])),
        HostMethod.unsubscribe: MethodDoc(
            "Stop receiving publications on a pattern",
            params: [P("pattern", .string, required: true, "a pattern given to bus.subscribe (alias: topic)")],
            result: .init(.object, "", fields: [P("subscriptions", .array, required: true, "this connection's patterns")])),
        HostMethod.publish: MethodDoc(
            "Publish a notification to the subscribers of a topic",
            params: [
                P("topic", .string, required: true, "not bus.*, consent.* or a plugin's namespace"),
                P("data", .any, "the notification's params: an object or an array (alias: params)"),
            ],
            result: .init(.object, "", fields: [P("delivered", .integer, required: true, "subscribers it was sent to")])),
        HostMethod.provide: MethodDoc(
            "Serve methods from this client connection (callbacks for plugins)",
            params: [P("method", .string, "<namespace>.<name>"), P("methods", .array, "several names")],
            result: .init(.object, "", fields: [P("provides", .array, required: true, "this connection's methods")])),
        HostMethod.unprovide: MethodDoc(
            "Stop serving methods",
            params: [P("method", .string, "<namespace>.<name>"), P("methods", .array, "several names")],
            result: .init(.object, "", fields: [P("provides", .array, required: true, "this connection's methods")])),
        HostMethod.restart: MethodDoc(
            "Admins: restart a plugin now (also clears failed)",
            params: [P("plugin", .string, required: true, "the plugin's name")],
            result: .init(.object, "", fields: [P("plugin", .string, required: true, ""), P("state", .string, required: true, "")])),
        HostMethod.consentGet: MethodDoc(
            "One consent switch: its effective value and both layers",
            params: [keyParam],
            result: .init(
                .object, "",
                fields: [
                    P("key", .string, required: true, ""), P("granted", .boolean, required: true, "effective value"),
                    P("explicit", .boolean, required: true, "operator layer, null if never set"),
                    P("app", .boolean, required: true, "app layer, null if never set"),
                    P("master", .boolean, required: true, "the device switch"),
                ])),
        HostMethod.consentSet: MethodDoc(
            "Admins: set a switch in the operator layer",
            params: [keyParam, P("granted", .boolean, required: true, "true grants, false denies (aliases: enabled, value)")],
            result: consentResult),
        HostMethod.consentSetApp: MethodDoc(
            "Plugins: set the app layer of one of their own switches (<plugin>:...)",
            params: [keyParam, P("granted", .boolean, required: true, "true grants, false denies")], result: consentResult),
        HostMethod.consentList: MethodDoc(
            "The consent switches (non-admins: the device switch only)",
            result: .init(
                .object, "",
                fields: [
                    P("master", .boolean, required: true, ""), P("epoch", .integer, required: true, ""),
                    P("switches", .object, required: true, "effective values"), P("operator", .object, required: true, ""),
                    P("app", .object, required: true, ""),
                ])),
        HostMethod.consentClear: MethodDoc(
            "Admins: return a switch to never set (whoever may call consent.set)",
            params: [keyParam, P("layer", .string, "operator (default) or app")],
            result: .init(.object, "the switch after the change, with cleared: true", fields: consentResult.fields)),
        HostMethod.monitor: MethodDoc(
            "Admins: receive a bus.monitor.event notification for each routed message",
            params: [
                P("pattern", .string, "method pattern (default *)"), P("verbose", .boolean, "also each message's params"),
            ],
            result: .init(
                .object, "",
                fields: [
                    P("pattern", .string, required: true, ""), P("verbose", .boolean, required: true, ""),
                    P("maxQueuedBytes", .integer, required: true, "a monitor further behind is disconnected"),
                ])),
        HostMethod.reload: MethodDoc(
            "Admins and pylond's own user: re-read the configuration, as SIGHUP does",
            result: .init(
                .object, "what changed (a refused configuration is error -32010)",
                fields: [
                    P("reloaded", .boolean, required: true, ""), P("added", .array, required: true, "plugins"),
                    P("removed", .array, required: true, "plugins"),
                ])),
        HostMethod.logLevel: MethodDoc(
            "Admins: set the host's log level, or a plugin's",
            params: [P("level", .string, required: true, "debug, info, warn or error"), P("plugin", .string, "a plugin's name")],
            result: .init(.object, "", fields: [P("level", .string, required: true, ""), P("plugin", .string, "")])),
    ]
}
