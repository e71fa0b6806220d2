#!/bin/bash
set -euo pipefail

mkdir -p /var/www/site
echo '<h1>Harbor status: green</h1>' > /var/www/site/index.html
printf 'ok' > /var/www/site/health

cat > /etc/nginx/sites-available/site <<'CONF'
server {
    listen 8080;
    root /var/www/site;
    index index.html;
    location / {
        try_files $uri $uri/ =404;
    }
}
CONF
ln -sf /etc/nginx/sites-available/site /etc/nginx/sites-enabled/site

nginx -t
nginx
sleep 1
curl -fsS http://localhost:8080/health
