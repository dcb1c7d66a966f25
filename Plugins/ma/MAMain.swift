import PylonPluginKit

/// pylon-ma: the MA analytics SDK surface as a service (reference: docs/MA.md).
///
/// This file is only the registration table; the handlers are `MAService` methods, one file per
/// concern: identity (`MAService+Identity`), events (`+Events`), the data-collection switch
/// (`+Consent`), upload cadence and sessions (`+Session`), contacts, channel values and user
/// properties (`+Profile`), the operator view (`+Status`). The order below is the manifest's.
///
/// The plugin as a library: `run()` is its whole program. The `pylon-ma` executable
/// (`main/main.swift`) and the multi-call `pylon` binary (Sources/pylon) call it.
public enum MAMain {
    public static func run() -> Never {
        let plugin = Plugin(name: "ma", version: "0.1.0")
        // Calls act on the caller's AppKey: `appKey`, else the AppKey its connection last started.
        plugin.wantsCallerInfo = true
        // A call past the host's deadline still goes on (a start waiting for the network, an
        // event held for a restarting uploader): the host answers it pending, -32008.
        plugin.continuesAfterDeadline = true
        // Built from the host's welcome (`MAService.open`); `ma.serve` answers -32001 before.
        let ma = plugin.service(MAService.open)
        plugin.checkConfig = { j throws(ConfigProblems) in try MAConfig(j).warnings }

        // Identity: start and identifyAccount run strictly in call order per AppKey.
        plugin.method("start", ma.serve { $0.start($1) })
        plugin.method("identifyAccount", ma.serve { $0.identifyAccount($1) })
        plugin.method("euid", ma.serve { $0.euid($1) })
        // Events, served from the request's bytes: while the AppKey's switch is denied the host answers
        // `{"code":0,"message":""}` itself.
        plugin.method(
            "eventRecord", consent: "ma:{appKey}", dropWhenDenied: true,
            deniedResult: MAService.result(0, ""), reads: .text, ma.serve { $0.eventRecord($1) })
        // The data collection switch and what is collected.
        plugin.method("setDataCollectionEnabled", ma.serve { $0.setDataCollectionEnabled($1) })
        plugin.method("isDataCollectionEnabled", ma.serve { $0.isDataCollectionEnabled($1) })
        plugin.method("setCollectControl", ma.serve { $0.setCollectControl($1) })
        plugin.method("setUtmProperties", ma.serve { $0.setUtmProperties($1) })
        // Upload cadence and sessions.
        plugin.method("setReportInterval", ma.serve { $0.setReportInterval($1) })
        plugin.method("setMaxEventCacheCount", ma.serve { $0.setMaxEventCacheCount($1) })
        plugin.method("setSessionTimeout", ma.serve { $0.setSessionTimeout($1) })
        plugin.method("setAppState", ma.serve { $0.setAppState($1) })
        // Contacts, channel values and user properties (validated here, sent to the backend).
        plugin.method("setUserContact", ma.serve { $0.setUserContact($1) })
        plugin.method("setChannelValue", ma.serve { $0.setChannelValue($1) })
        plugin.method("setProperty", ma.serve { $0.setProperty($1) })
        plugin.method("increaseProperty", ma.serve { $0.increaseProperty($1) })
        plugin.method("addProperty", ma.serve { $0.addProperty($1) })
        plugin.method("removeProperty", ma.serve { $0.removeProperty($1) })
        plugin.method("deleteProperty", ma.serve { $0.deleteProperty($1) })
        plugin.method("updateObjectArrayProperty", ma.serve { $0.updateObjectArrayProperty($1) })
        plugin.method("addObjectArrayProperty", ma.serve { $0.addObjectArrayProperty($1) })
        plugin.method("removeObjectArrayProperty", ma.serve { $0.removeObjectArrayProperty($1) })
        // Operator view (not an SDK method).
        plugin.method("status", ma.serve { $0.status($1) })
        // Admins only: hand an AppKey to another uid, or release it (docs/MA.md, "AppKey owners").
        plugin.method("setOwner", ma.serve { $0.setOwner($1) })
        MAMethodDocs.declare(plugin)

        plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { ma.current?.clientClosed(c) } }
        plugin.onConsentChanged = { _, granted in if !granted { ma.current?.clearUtmWhereDenied() } }
        plugin.onShutdown = { ma.current?.http.shutdown() }
        plugin.run()
    }
}
