import PylonPluginKit

/// What each `echo.*` method takes and answers, as `bus.describe` shows it. No method lets the
/// host check its params: then `echo.echo`, the routing benchmark's method, costs the fast path
/// nothing more (`Bus.takesParamCheck` is one emptiness test). Called once from main.swift.
func declareEchoDocs(_ plugin: Plugin) {
    typealias P = MethodDoc.Param
    plugin.describe("echo", MethodDoc("Answers its params unchanged (routed from the request's bytes)", result: .init(.any, "the params")))
    plugin.describe(
        "sleep",
        MethodDoc(
            "Answers after ms milliseconds", params: [P("ms", .integer, "how long (default 0)")],
            result: .init(.object, "", fields: [P("slept_ms", .integer, required: true, "")])))
    plugin.describe(
        "hang", MethodDoc("Answers, then stops serving anything (liveness tests)", result: .init(.object, "{hanging: true}")))
    plugin.describe("crash", MethodDoc("Exits abnormally at once (no answer)", result: .init(.null, "never answered")))
    plugin.describe(
        "collect",
        MethodDoc(
            "A consent-scoped method under echo:{appKey}",
            params: [P("appKey", .string, "names the switch"), P("data", .any, "stored")],
            result: .init(.object, "", fields: [P("stored", .any, required: true, "the data")])))
    for (name, who) in [("call", "on the caller's behalf"), ("callAsPlugin", "as the plugin itself")] {
        plugin.describe(
            name,
            MethodDoc(
                "Calls another method through the host \(who)",
                params: [P("method", .string, required: true, ""), P("params", .any, "its params")],
                result: .init(.object, "", fields: [P("result", .any, required: true, "the inner call's result")])))
    }
    plugin.describe(
        "publish",
        MethodDoc(
            "Publishes a notification",
            params: [P("topic", .string, required: true, ""), P("data", .any, "the notification's params")],
            result: .init(.object, "", fields: [P("published", .string, required: true, "the topic")])))
    plugin.describe(
        "repeat",
        MethodDoc(
            "Answers text repeated times times (at most 64 MiB)",
            params: [P("text", .string, "default x"), P("times", .integer, "default 1")], result: .init(.string, "the text")))
    plugin.describe("consentLog", MethodDoc("The consent.changed notifications received", result: .init(.array, "{key, granted}")))
    plugin.describe("caller", MethodDoc("Who called (with PYLON_ECHO_CALLER=1)", result: .init(.any, "the _pylon caller info, or null")))
    plugin.describe("closedClients", MethodDoc("Client connections the host reported closed", result: .init(.array, "client ids")))
}
