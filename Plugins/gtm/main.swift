import PylonPluginKit

/// pylon-gtm: tag-manager containers as a service (docs/GTM.md).
let plugin = Plugin(name: "gtm", version: "0.1.0")
plugin.wantsCallerInfo = true
let gtm = GTMService(plugin: plugin)

plugin.onReady = { gtm.start() }
plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { gtm.clientClosed(c) } }
plugin.declarePublishes("gtm.container.refresh")
plugin.declarePublishes("gtm.container.available")
plugin.declarePublishes(GTMLog.topic)

plugin.method("openContainer") { gtm.open($0) }
plugin.method("closeContainer") { gtm.close($0) }
plugin.method("getValue") { gtm.getValue($0) }
plugin.method("push") { gtm.push($0) }
plugin.method("refresh") { gtm.refresh($0) }
plugin.method("preview") { gtm.preview($0) }
plugin.method("registerFunctionCallMacro") { gtm.register($0, tag: false) }
plugin.method("registerFunctionCallTag") { gtm.register($0, tag: true) }
plugin.method("setLogLevel") { call in
    guard let s = call.params["level"]?.stringValue, let l = GTMLogLevel(rawValue: s) else {
        call.fail(RPCError(.invalidParams, "level must be verbose, debug, info, warning, error or none"))
        return
    }
    gtm.log.level = l
    call.reply(["level": .string(l.rawValue)])
}
plugin.method("status") { $0.reply(gtm.status()) }

plugin.run()
