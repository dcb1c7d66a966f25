import PylonPluginKit

/// pylon-echo: a minimal plugin used by tests, examples and the routing benchmark.
///
/// - `echo.echo`: replies with its params unchanged (no conversion to Swift values).
/// - `echo.sleep {ms}`: replies after `ms` milliseconds (timeouts, in-flight failure tests).
/// - `echo.hang {}`: stops the loop from serving anything (liveness tests).
/// - `echo.crash {}`: exits abnormally at once.
/// - `echo.collect {appKey, data}`: a consent-scoped method under `echo:{appKey}`.
/// - `echo.call {method, params}`: calls another method through the host on the caller's behalf
///   (plugin→plugin routing).
/// - `echo.callAsPlugin {method, params}`: the same call made as the plugin itself.
/// - `echo.publish {topic, data}`: publishes a notification.
/// - `echo.repeat {text, times}`: replies with `text` repeated `times` times (at most 64 MiB):
///   a reply far larger than its request.
let plugin = Plugin(name: "echo", version: pylonVersionEcho)

// Answered from the request's bytes: the params' text is the result.
plugin.method("echo", reads: .text) { call in call.reply(serialized: call.paramsText) }
plugin.method("sleep") { call in
    let ms = UInt64(max(0, call.params["ms"]?.intValue ?? 0))
    plugin.loop.after(ms: ms) { call.reply(["slept_ms": .int(Int64(ms))]) }
}
plugin.method("hang") { call in
    call.reply(["hanging": true])
    plugin.loop.flushDirty()
    while true { sleepSeconds(3600) }
}
plugin.method("crash") { _ in
    abortNow()
}
plugin.method("collect", consent: "echo:{appKey}") { call in
    call.reply(["stored": call.params["data"] ?? .null])
}
/// `echo.call` / `echo.callAsPlugin`: relays `params.method` through the host, for the caller
/// (the host applies the caller's permissions to the inner call) or as the plugin itself.
func relay(_ call: Call, asPlugin: Plugin?) {
    guard let m = call.params["method"]?.stringValue else {
        call.fail(RPCError(.invalidParams, "params.method is required"))
        return
    }
    let done: (Result<JSON, RPCError>) -> Void = { r in
        switch r {
        case .success(let v): call.reply(["result": v])
        case .failure(let e): call.fail(e)
        }
    }
    if let asPlugin { asPlugin.call(m, call.params["params"], done) } else { call.call(m, call.params["params"], done) }
}
plugin.method("call") { relay($0, asPlugin: nil) }
plugin.method("callAsPlugin") { relay($0, asPlugin: plugin) }
plugin.method("publish") { call in
    guard let t = call.params["topic"]?.stringValue else {
        call.fail(RPCError(.invalidParams, "params.topic is required"))
        return
    }
    plugin.publish(t, call.params["data"] ?? .null)
    call.reply(["published": .string(t)])
}
plugin.method("repeat") { call in
    let text = call.params["text"]?.stringValue ?? "x"
    let times = call.params["times"]?.intValue ?? 1
    guard times >= 0, !text.isEmpty, Int64(text.utf8.count) * times <= 64 << 20 else {
        call.fail(RPCError(.invalidParams, "text repeated times must be at most 64 MiB"))
        return
    }
    call.reply(.string(String(repeating: text, count: Int(times))))
}
var consentLog: [JSON] = []
plugin.onConsentChanged = { key, granted in
    consentLog.append(["key": .string(key), "granted": .bool(granted)])
}
plugin.method("consentLog") { call in call.reply(.array(consentLog)) }
// `echo.caller`: who called (only with PYLON_ECHO_CALLER=1, which turns on caller info).
plugin.wantsCallerInfo = System.env("PYLON_ECHO_CALLER") == "1"
plugin.method("caller") { call in
    let c = call.callerInfo
    call.reply(c == CallerInfo() ? .null : (try? JSON.parse(c.serialized)) ?? .null)
}
// `echo.closedClients`: client connections the host reported closed.
var closedClients: [JSON] = []
plugin.subscribe("bus.client.closed") { _, p in closedClients.append(p["client"] ?? .null) }
plugin.method("closedClients") { call in call.reply(.array(closedClients)) }
plugin.declarePublishes("echo.*")
declareEchoDocs(plugin)
plugin.run()
