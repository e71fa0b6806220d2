#!/bin/bash
set -euo pipefail
cat > /app/payment.sh <<'SH'
#!/bin/bash
set -euo pipefail
p=$1 rate=$2 years=$3
bc -l <<BC
scale = 20
p = $p; n = $years * 12; r = $rate / 1200
if (r == 0) x = p / n else x = p * r / (1 - e(-n * l(1 + r)))
scale = 2
(x * 100 + 0.5) / 100
BC
SH
chmod +x /app/payment.sh
/app/payment.sh 200000 6.5 30
