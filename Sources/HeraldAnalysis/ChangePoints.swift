import Foundation
import HeraldCore

/// Change points of a nightly series by E-Divisive (Matteson and James, 2014: "A nonparametric
/// approach for multiple change point analysis of multivariate data", JASA 109), the method
/// MongoDB's Hunter and Apache Otava run over performance histories (docs/STATISTICS.md).
///
/// For a split of a segment into X (first m values) and Y (the other k), the energy distance
/// E = 2/(mk) Σ|x−y| − 1/C(m,2) Σ|x−x'| − 1/C(k,2) Σ|y−y'| (α = 1) weighed by mk/(m+k) is
/// largest where the distribution changes. The best split of a segment is kept when a
/// permutation test (the segment's values shuffled, `permutations` times, seeded) finds its
/// statistic in the top `alpha`; the two halves are then searched again (binary segmentation),
/// each at least `minimumSize` long. Deterministic for a given seed.
public enum ChangePoints {
    public struct Change: Codable, Sendable, Equatable {
        /// Index of the first value after the change.
        public var index: Int
        public var before: Double
        public var after: Double
        /// Permutation p-value of the split (at least 1/(permutations+1)).
        public var p: Double
    }

    public static let alpha = 0.05
    public static let permutations = 199
    public static let minimumSize = 3

    public static func find(_ series: [Double], alpha: Double = alpha, permutations: Int = permutations, minimumSize: Int = minimumSize, seed: UInt64 = 1) -> [Change] {
        let values = series.filter(\.isFinite)
        guard values.count == series.count, values.count >= 2 * minimumSize else { return [] }
        var g = SeededGenerator(seed: seed, stream: "e-divisive")
        var out = [Change]()
        var segments = [0..<values.count]
        while let seg = segments.popLast() {
            let part = Array(values[seg])
            guard part.count >= 2 * minimumSize, let (tau, q) = best(part, minimumSize: minimumSize), q > 0 else { continue }
            var atLeast = 0
            var shuffled = part
            for _ in 0..<permutations {
                shuffle(&shuffled, &g)
                if let (_, qp) = best(shuffled, minimumSize: minimumSize), qp >= q - 1e-12 { atLeast += 1 }
            }
            let p = Double(atLeast + 1) / Double(permutations + 1)
            guard p <= alpha else { continue }
            let cut = seg.lowerBound + tau
            out.append(Change(index: cut, before: mean(values[seg.lowerBound..<cut]), after: mean(values[cut..<seg.upperBound]), p: p))
            segments.append(seg.lowerBound..<cut)
            segments.append(cut..<seg.upperBound)
        }
        return out.sorted { $0.index < $1.index }
    }

    /// The split with the largest weighed energy statistic, and that statistic.
    static func best(_ x: [Double], minimumSize: Int) -> (Int, Double)? {
        let n = x.count
        guard n >= 2 * minimumSize else { return nil }
        // P[i][j] = Σ_{a<i, b<j} |x_a − x_b|, so every block sum is four look-ups.
        var p = [Double](repeating: 0, count: (n + 1) * (n + 1))
        for i in 0..<n {
            var row = 0.0
            for j in 0..<n {
                row += abs(x[i] - x[j])
                p[(i + 1) * (n + 1) + j + 1] = p[i * (n + 1) + j + 1] + row
            }
        }
        func block(_ r: Range<Int>, _ c: Range<Int>) -> Double {
            p[r.upperBound * (n + 1) + c.upperBound] - p[r.lowerBound * (n + 1) + c.upperBound]
                - p[r.upperBound * (n + 1) + c.lowerBound] + p[r.lowerBound * (n + 1) + c.lowerBound]
        }
        var bestTau = -1, bestQ = -Double.infinity
        for tau in minimumSize...(n - minimumSize) {
            let m = Double(tau), k = Double(n - tau)
            let between = block(0..<tau, tau..<n)
            let withinX = block(0..<tau, 0..<tau) / 2, withinY = block(tau..<n, tau..<n) / 2
            let e = 2 * between / (m * k) - withinX / (m * (m - 1) / 2) - withinY / (k * (k - 1) / 2)
            let q = m * k / (m + k) * e
            if q > bestQ + 1e-12 { bestQ = q; bestTau = tau }
        }
        return bestTau < 0 ? nil : (bestTau, bestQ)
    }

    static func shuffle(_ a: inout [Double], _ g: inout SeededGenerator) {
        guard a.count > 1 else { return }
        for i in stride(from: a.count - 1, to: 0, by: -1) {
            let j = Int(g.next() % UInt64(i + 1))
            a.swapAt(i, j)
        }
    }

    static func mean(_ s: ArraySlice<Double>) -> Double { s.isEmpty ? .nan : s.reduce(0, +) / Double(s.count) }
}
