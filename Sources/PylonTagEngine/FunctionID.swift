/// The function ids a container may name, as the legacy runtime knew them. Anything else is
/// `.unknown` and evaluates to the type default with the warning
/// "<id> has no backing implementation".
public enum FunctionID: Sendable, Equatable {
    // Predicates.
    case equals, contains, startsWith, endsWith, regex, lessThan, lessEqual, greaterThan, greaterEqual
    // Macros.
    case constant, dataLayer, event, appName, appVersion, appId, language, osVersion, platform
    case deviceName, deviceType, random, time, resolution, containerVersion, sdkVersion, runtimeVersion
    case functionCall, joiner, simpleMap, regexGroup, encode, hash
    // Tags (`_func` is `functionCall` for tags too).
    case analyticsHit, pixel
    case unknown(String)

    public init(_ id: String) {
        switch id {
        case "_eq": self = .equals
        case "_cn": self = .contains
        case "_sw": self = .startsWith
        case "_ew": self = .endsWith
        case "_re": self = .regex
        case "_lt": self = .lessThan
        case "_le": self = .lessEqual
        case "_gt": self = .greaterThan
        case "_ge": self = .greaterEqual
        case "_c": self = .constant
        case "_v": self = .dataLayer
        case "_e": self = .event
        case "_an": self = .appName
        case "_av": self = .appVersion
        case "_ai": self = .appId
        case "_l": self = .language
        case "_ov": self = .osVersion
        case "_p": self = .platform
        case "_dn": self = .deviceName
        case "_dt": self = .deviceType
        case "_r": self = .random
        case "_t": self = .time
        case "_rs": self = .resolution
        case "_ctv": self = .containerVersion
        case "_sv": self = .sdkVersion
        case "_rv": self = .runtimeVersion
        case "_func": self = .functionCall
        case "_jn": self = .joiner
        case "_smm": self = .simpleMap
        case "_reg": self = .regexGroup
        case "_enc": self = .encode
        case "_hsh": self = .hash
        case "_ua": self = .analyticsHit
        case "_img": self = .pixel
        default: self = .unknown(id)
        }
    }

    public var isPredicate: Bool {
        switch self {
        case .equals, .contains, .startsWith, .endsWith, .regex, .lessThan, .lessEqual, .greaterThan, .greaterEqual: return true
        default: return false
        }
    }
}
