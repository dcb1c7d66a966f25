import PylonClientKit
import PylonTagEngine

#if canImport(Glibc)
import Glibc
#endif

/// `pylon-bench gtm`: the tag-manager plugin.
/// 1. Parse-and-index time of a ~1 MB container (in this process: the engine the plugin runs).
/// 2. `gtm.getValue` of a rule-driven macro through the host, pipelined (`--window`, default 64).
/// 3. `gtm.push` of an event against a 1,000-rule container: pushes/s through the host, the
///    plugin's CPU per push, and the engine's own time per push (merge + rules + tags) p50/p99.
/// Plus the gtm plugin's idle RSS.
func gtmBench() throws {
    // 1. A ~1 MB container: 3,000 macros, predicates, tags and rules.
    var macros: [JSON] = [], preds: [JSON] = [], tags: [JSON] = [], rules: [JSON] = []
    for i in 0..<3000 {
        macros.append([
            "function": "_c", "instance_name": .string("k\(i)"), "value": .string("value-\(i)-" + String(repeating: "x", count: 150)),
        ])
        preds.append(["function": "_eq", "arg0": ["macro", .int(Int64(i))], "arg1": .string("v\(i)")])
        tags.append(["function": "_func", "name": .string("t\(i)")])
        rules.append([["if", .int(Int64(i))], ["add", .int(Int64(i))]])
    }
    let big = JSON.object([
        "resource": [
            "version": "1", "macros": .array(macros), "predicates": .array(preds), "tags": .array(tags),
            "rules": .array(rules),
        ]
    ]).serialized
    var parse: [UInt64] = []
    for _ in 0..<20 {
        let t0 = Loop.hrtimeNs
        _ = try Container.parse(text: big)
        parse.append(Loop.hrtimeNs - t0)
    }
    parse.sort()
    print(
        "parse + index a \(big.utf8.count / 1024) KiB container (3,000 macros/predicates/tags/rules): p50 \(fmt(percentile(parse, 0.5) / 1000)) ms, max \(fmt(percentile(parse, 1.0) / 1000)) ms"
    )

    // The bench container: a rule-driven macro and 1,000 tag rules.
    let rulesText = gtmRulesContainer(1000)
    let engine = try Container.parse(text: rulesText)
    var dl = DataLayer()
    var inPlugin: [UInt64] = []
    for i in 0..<20_000 {
        let t0 = Loop.hrtimeNs
        dl.push(["event": "tap", "screenName": .string("s\(i % 1000)")])
        let t = engine.tagsToFire(context: EvaluationContext(dataLayer: dl, event: "tap"))
        inPlugin.append(Loop.hrtimeNs - t0)
        precondition(t.tags.count == 1)
    }
    inPlugin.sort()
    print(
        "engine, one push over 1,000 rules (merge + rules + tags): p50 \(fmt(percentile(inPlugin, 0.5))) µs, p99 \(fmt(percentile(inPlugin, 0.99))) µs"
    )

    let defaults = tmp + "/gtm-defaults"
    _ = System.makeDirectories(defaults)
    _ = System.writeFileAtomically(defaults + "/GTM-BENCH", Array(rulesText.utf8))
    startHost(plugins: [
        [
            "name": "gtm", "exec": "pylon-gtm",
            "config": ["defaultsDir": .string(defaults), "backend": "http://127.0.0.1:9", "logLevel": "error"],
        ]
    ])
    let sync = try SyncClient(path: socketPath)
    let status = try sync.call("bus.status")
    let pid = Int32(status["plugins"]?.arrayValue?.first?["pid"]?.intValue ?? 0)
    usleep(300_000)
    print("gtm plugin idle RSS \(System.rssKiB(pid: pid) ?? 0) KiB (no container open)")
    _ = try sync.call("gtm.openContainer", ["containerId": "GTM-BENCH", "openType": "default"])
    let v = try sync.call("gtm.getValue", ["containerId": "GTM-BENCH", "key": "greeting", "language": "it"])
    precondition(v["value"] == "Ciao", "rule-driven value: \(v)")
    usleep(300_000)
    print("gtm plugin RSS with the 1,000-rule container open \(System.rssKiB(pid: pid) ?? 0) KiB")

    let get =
        #"{"jsonrpc":"2.0","id":1,"method":"gtm.getValue","params":{"containerId":"GTM-BENCH","key":"greeting","type":"string","language":"it"}}"#
    try pipelined("gtm.getValue (rule-driven macro)", line: get, expect: #""Ciao""#, pluginPid: pid)
    let push = #"{"jsonrpc":"2.0","id":1,"method":"gtm.push","params":{"data":{"event":"tap","screenName":"s500"}}}"#
    try pipelined("gtm.push (1,000 rules)", line: push, expect: #""queued":true"#, pluginPid: pid)
    stopHost()
}

/// Pipelined requests of one line, `--window` in flight, for `seconds`; FIFO latencies (one
/// connection to one plugin answers in order).
func pipelined(_ name: String, line: String, expect: String, pluginPid: Int32) throws {
    let conn = try Connection.connect(loop: loop, path: socketPath, maxLineBytes: 1 << 20)
    var sent = 0, ok = 0, errors = 0
    var sentAt: [UInt64] = []
    sentAt.reserveCapacity(4_000_000)
    var head = 0
    var lat: [UInt64] = []
    lat.reserveCapacity(4_000_000)
    let start = Loop.hrtimeNs
    let deadline = start + UInt64(seconds * 1e9)
    let cpu0 = cpuTicks(pluginPid)
    let needle = Array(expect.utf8)
    func sendOne() { sent += 1; sentAt.append(Loop.hrtimeNs); conn.sendLine(line) }
    conn.onLine = { l in
        let now = Loop.hrtimeNs
        lat.append(now - sentAt[head])
        head += 1
        if find(l, needle) != nil { ok += 1 } else { errors += 1 }
        if now < deadline { sendOne() } else if ok + errors == sent { loop.stop() }
    }
    conn.startReading()
    for _ in 0..<gtmWindow { sendOne() }
    loop.flushDirty()
    loop.run()
    let secs = Double(Loop.hrtimeNs - start) / 1e9
    lat.sort()
    let tick = 1e6 / Double(sysconf(Int32(_SC_CLK_TCK))) / Double(max(ok, 1))
    print(
        "\(name), \(gtmWindow) in flight: \(Int(Double(ok) / secs)) /s, p50 \(fmt(percentile(lat, 0.5))) µs, p99 \(fmt(percentile(lat, 0.99))) µs, plugin CPU \(fmt((cpuTicks(pluginPid) - cpu0) * tick)) µs each, errors \(errors)"
    )
    conn.close()
    loop.runNoWait()
}

nonisolated(unsafe) var gtmWindow = 64

/// A container with `greeting` chosen by the device language (it/es/default) and `n` tag rules
/// (`event == tap` and `screenName == s<i>` → tag i).
func gtmRulesContainer(_ n: Int) -> String {
    var macros: [JSON] = [
        ["function": "_l", "instance_name": "lang"], ["function": "_e", "instance_name": "event"],
        ["function": "_v", "instance_name": "screen", "name": "screenName"],
        ["function": "_c", "instance_name": "greeting", "value": "Ciao", "not_default_macro": true],
        ["function": "_c", "instance_name": "greeting", "value": "Hola", "not_default_macro": true],
        ["function": "_c", "instance_name": "greeting", "value": "Hello"],
    ]
    var preds: [JSON] = [
        ["function": "_eq", "arg0": ["macro", 0], "arg1": "it"], ["function": "_eq", "arg0": ["macro", 0], "arg1": "es"],
        ["function": "_eq", "arg0": ["macro", 1], "arg1": "tap"],
    ]
    var rules: [JSON] = [[["if", 0], ["add_macro", 3]], [["if", 1], ["add_macro", 4]]]
    var tags: [JSON] = []
    for i in 0..<n {
        preds.append(["function": "_eq", "arg0": ["macro", 2], "arg1": .string("s\(i)")])
        tags.append(["function": "_func", "name": .string("t\(i)")])
        rules.append([["if", 2, .int(Int64(3 + i))], ["add", .int(Int64(i))]])
    }
    macros.append(["function": "_c", "instance_name": "unused", "value": 1])
    return JSON.object([
        "resource": [
            "version": "bench", "macros": .array(macros), "predicates": .array(preds), "tags": .array(tags),
            "rules": .array(rules),
        ]
    ]).serialized
}
